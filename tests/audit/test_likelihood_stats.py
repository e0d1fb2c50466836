"""Bits-per-byte arithmetic, the likelihood block, its paired comparison and the compressor
reference (audit.stats.likelihood, audit.worlds.compressor): properties and known answers."""

from __future__ import annotations

import math
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.stats.intervals import IntervalSpec
from audit.stats.likelihood import (
    bits_per_byte,
    compare_likelihood,
    likelihood_block,
    likelihood_entry,
    pooled,
)
from audit.store.step_rows import StepRow
from audit.worlds.compressor import WINDOW, CompressorReference, code_bits, dictionary

SPEC = IntervalSpec(resamples=200, seed=0)
texts = st.text(max_size=60)


@given(nats=st.floats(0, 1e4), text=texts)
def test_entry_bits_per_byte_is_nats_over_ln2_over_utf8_bytes(nats, text):
    e = likelihood_entry(nats, 3, text)
    assert e["bytes"] == len(text.encode("utf-8", "surrogatepass"))
    if e["bytes"] == 0:
        assert e["bits_per_byte"] is None
    else:
        assert e["bits_per_byte"] * e["bytes"] * math.log(2) == pytest.approx(nats, abs=1e-9)
    StepRow.model_validate({"trajectory_id": "t", "task_id": "t", "step": 0, "tool": "x",
                            "actual": text, "diverged": True, "likelihood": e})


def test_known_answers():
    assert bits_per_byte(math.log(2) * 8, 1) == pytest.approx(8.0)  # one byte, uniform: 8 bits
    assert bits_per_byte(1.0, 0) is None
    assert likelihood_entry(0.0, 1, "é")["bytes"] == 2  # UTF-8 bytes, not characters


rows_st = st.lists(st.tuples(st.integers(0, 5), st.floats(0, 500), st.integers(0, 40)),
                   min_size=1, max_size=25)


def _rows(spec):
    out = []
    for k, (cluster, nats, nbytes) in enumerate(spec):
        out.append({"trajectory_id": f"t{cluster}", "cluster": f"c{cluster}", "step": k % 4,
                    "tool": "ls" if k % 2 else "cd", "mutates_state": bool(k % 2),
                    "novelty": (k % 10) / 10,
                    "likelihood": {"nats": nats, "tokens": 1, "bytes": nbytes,
                                   "bits_per_byte": bits_per_byte(nats, nbytes)}})
    return out


@settings(max_examples=40, deadline=None)
@given(rows_st)
def test_pooled_rate_is_total_bits_over_total_bytes_and_in_its_interval(spec):
    rows = _rows(spec)
    p = pooled(rows, SPEC)
    total_bytes = sum(b for _, _, b in spec)
    if total_bytes == 0:
        assert p["point"] is None
        return
    assert p["point"] == pytest.approx(sum(n for _, n, _ in spec) / math.log(2) / total_bytes)
    # equally: each step's rate weighted by its bytes
    weighted = sum(r["likelihood"]["bits_per_byte"] * r["likelihood"]["bytes"]
                   for r in rows if r["likelihood"]["bytes"]) / total_bytes
    assert p["point"] == pytest.approx(weighted + sum(
        n for _, n, b in spec if b == 0) / math.log(2) / total_bytes)
    if p["ci"] is not None:
        assert p["ci"][0] <= p["point"] + 1e-9 <= p["ci"][1] + 2e-9
    block = likelihood_block(rows, SPEC)
    assert block["steps"] == len(rows)
    assert sum(g["n"] for g in block["by_tool"].values()) == len(rows)
    assert sum(g["n"] for g in block["by_depth"].values()) == len(rows)


def test_one_cluster_has_no_interval_not_a_rate_interval():
    rows = _rows([(0, 5.0, 10), (0, 7.0, 12)])
    p = pooled(rows, SPEC)
    assert p["point"] is not None and p["ci"] is None and p["method"] == "no_spread"


def test_compare_pairs_the_same_calls():
    a = _rows([(c, 10.0 + c, 20) for c in range(6)])
    for r in a:
        r.update(task_id=r["trajectory_id"], arguments={})
    same = compare_likelihood(a, [dict(r) for r in a], SPEC)
    assert same["pairs"] == 6 and same["diff"] == pytest.approx(0.0)
    doubled = [dict(r, likelihood=dict(r["likelihood"], nats=2 * r["likelihood"]["nats"]))
               for r in a]
    d = compare_likelihood(a, doubled, SPEC)
    assert d["diff"] == pytest.approx(d["a"]) and d["ci"][0] > 0


def test_compressor_code_is_a_real_code_and_priming_helps():
    seen = '{"current_working_directory": "workspace"}'
    ref = CompressorReference.from_triples([("cd", {}, seen)] * 3 + [("cd", {}, '{"x": 1}')])
    zdict = ref.dictionaries["cd"]
    comp = zlib.compressobj(9, zlib.DEFLATED, -15, zdict=zdict)
    stream = comp.compress(seen.encode()) + comp.flush()
    back = zlib.decompressobj(-15, zdict=zdict)
    assert back.decompress(stream) + back.flush() == seen.encode()  # decodable: a real code
    assert ref.bits("cd", seen) == 8 * len(stream)
    assert ref.bits("cd", seen) < ref.bits("unseen_tool", seen) == code_bits(seen)
    assert zdict.endswith(seen.encode())  # the most frequent response is nearest
    assert len(dictionary(["a" * 1000 + str(i) for i in range(100)])) == WINDOW
