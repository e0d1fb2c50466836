"""`envace-audit replay --shard I/N` and `envace-audit merge`: the shards of an audit, merged, are
byte for byte the audit a single run gives (every step row, trajectory row, skipped record,
warning, figure and interval with its seed; only `seconds` differs), and merge refuses shards
that are not one audit (exit 2, nothing written)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from audit.shard import parse_shard, shard_of
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.core.schema import TrajectoryWriter

AUDIT = [sys.executable, "-m", "audit.cli", "--quiet"]
N = 3


def _opts(**kw) -> AuditOptions:
    return AuditOptions(progress=False, plots=False, **kw)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    """Two files of dev trajectories: rehearsed responses, some altered (divergences at every
    depth), a line that is no record and a repeated id (both skipped)."""
    d = tmp_path_factory.mktemp("shards")
    trajs = list(export_real(split_tasks("dev")[:14]))
    for k, t in enumerate(trajs):
        for st in t.tool_steps():
            st.response.rehearsed = True
            if (st.step + k) % 3 == 0:
                st.response.content = json.dumps({"rehearsed": f"wrong {st.step}"})
    paths = [d / "a.jsonl", d / "b.jsonl"]
    with TrajectoryWriter(paths[0], mode="w") as w:
        for t in trajs[:8]:
            w.write(t)
    with open(paths[0], "a", encoding="utf-8") as fh:
        fh.write('{"not": "a trajectory"}\n')
    with TrajectoryWriter(paths[1], mode="a") as w:
        for t in trajs[8:]:
            w.write(t)
        w.write(trajs[2])  # a repeated id: skipped, in whichever shard holds the id
    return [str(p) for p in paths]


@pytest.fixture(scope="module")
def single(inputs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("single") / "audit"
    run_audit(inputs, out, _opts())
    return out


@pytest.fixture(scope="module")
def shards(inputs, tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("parts")
    outs = [d / f"s{i}" for i in range(N)]
    for i, out in enumerate(outs):
        run_audit(inputs, out, _opts(shard=(i, N)))
    return outs


def _summary(d: Path) -> dict:
    s = json.loads((d / "summary.json").read_text())
    s.pop("seconds")
    return s


def test_merged_shards_are_the_single_run_byte_for_byte(single, shards, tmp_path):
    ids = {json.loads(x)["trajectory_id"] for s in shards
           for x in (s / "trajectories.jsonl").read_text().splitlines()}
    assert len(ids) == 14
    assert all((s / "steps.jsonl").stat().st_size for s in shards)  # every shard holds work
    out = tmp_path / "merged"
    r = subprocess.run([*AUDIT, "merge", *map(str, reversed(shards)), "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 3, r.stderr  # the skipped records, as in the single run
    for name in ("steps.jsonl", "trajectories.jsonl"):
        assert (out / name).read_bytes() == (single / name).read_bytes(), name
    merged, one = _summary(out), _summary(single)
    assert json.dumps(merged) == json.dumps(one)
    assert one["counts"]["diverged"] > 0 and one["divergence_ci"] is not None
    assert [(Path(r["file"]).name, r["line"]) for r in one["skipped_records"]] == [
        ("a.jsonl", 9), ("b.jsonl", 7)]  # the line without an id; the repeated id


def test_each_record_is_counted_by_exactly_one_shard(single, shards):
    parts = [json.loads((s / "summary.json").read_text()) for s in shards]
    whole = json.loads((single / "summary.json").read_text())
    for key in ("records_read", "trajectories", "skipped", "steps"):
        assert sum(p["counts"][key] for p in parts) == whole["counts"][key], key
    assert [p["shard"]["index"] for p in parts] == list(range(N))
    bad = [p["counts"]["skipped"] for p in parts]
    assert bad[0] >= 1  # the line without an id is shard 0's


def _merge(dirs, out) -> subprocess.CompletedProcess:
    return subprocess.run([*AUDIT, "merge", *map(str, dirs), "--out", str(out)],
                          capture_output=True, text=True)


def test_merge_refuses_what_is_not_one_whole_audit(single, shards, inputs, tmp_path):
    other = tmp_path / "other"  # the same shard index audited under another verdict
    run_audit(inputs, other, _opts(shard=(1, N), verdict_scorer="json_f1",
                                   verdict_threshold=0.9))
    cases = {
        "missing": ([shards[0], shards[2]], "1/3 missing"),
        "twice": ([shards[0], shards[1], shards[1], shards[2]], "given twice"),
        "settings": ([shards[0], other, shards[2]], "settings"),
        "not a shard": ([single, *shards], "not a shard"),
    }
    for what, (dirs, words) in cases.items():
        out = tmp_path / what.replace(" ", "_")
        r = _merge(dirs, out)
        assert r.returncode == 2, (what, r.stderr)
        assert words in r.stderr and "nothing written" in r.stderr, (what, r.stderr)
        assert not out.exists()


def test_shards_partition_ids_and_parse_strictly():
    ids = [f"t{i}" for i in range(300)]
    owners = [shard_of(t, 4) for t in ids]
    assert set(owners) == {0, 1, 2, 3} and owners == [shard_of(t, 4) for t in ids]
    assert shard_of("t1", 1) == 0
    assert parse_shard("2/4") == (2, 4)
    for bad in ("4/4", "-1/4", "1", "a/b", "0/0"):
        with pytest.raises(ValueError):
            parse_shard(bad)


def test_a_bad_shard_or_an_input_named_twice_is_a_usage_error(inputs, tmp_path):
    bad = subprocess.run([*AUDIT, "replay", inputs[0], "--shard", "3/3", "--out",
                          str(tmp_path / "o")], capture_output=True, text=True)
    assert bad.returncode == 2 and "0 <= I < N" in bad.stderr
    twice = subprocess.run([*AUDIT, "replay", inputs[0], inputs[0], "--shard", "0/2", "--out",
                            str(tmp_path / "o")], capture_output=True, text=True)
    assert twice.returncode == 2 and "named twice" in twice.stderr
    assert not (tmp_path / "o").exists()
