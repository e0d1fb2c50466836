"""How probable reality is under a world model: bits per byte of the real responses.

A likelihood audit (``envace probe --likelihood``) scores every real tool response under the
model, teacher-forced on the real history: each step row carries ``likelihood``:

    {"nats": 41.3, "tokens": 17, "bytes": 52, "bits_per_byte": 1.146, "compressor_bits": 310}

``nats`` is minus the natural log-probability of the response's tokens *and* the closing
``<|im_end|>`` (the model says where the response ends); ``bits_per_byte`` = nats / ln 2 /
``bytes`` (the UTF-8 length of the response text; null for an empty response).
``compressor_bits`` (with ``--reference TRAIN.jsonl``) is the code length of the same text under
a general-purpose compressor primed with the train split's responses of the same tool
(``audit.worlds.compressor``): a yardstick in the same unit.

The summary's figure is the *pooled* rate, total bits / total bytes, a ratio of per-cluster sums,
so its interval is the audit's cluster bootstrap (``audit.stats.intervals.ratio_intervals``,
resampling ``resampling_unit``); ``mean_step_bits_per_byte`` (each step's rate averaged, steps of
at least one byte) is beside it, since short responses weigh little in the pooled rate.

    block = likelihood_block(rows, IntervalSpec(resamples=1000, seed=0, unit="scenario"))
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from audit.stats.clusters import CLUSTER
from audit.stats.depth_tables import stratum_label
from audit.stats.intervals import (
    BOOTSTRAP,
    NO_SPREAD,
    IntervalSpec,
    cluster_codes,
    ratio_difference,
    ratio_intervals,
)

LN2 = math.log(2.0)
KEY = "likelihood"  # the step-row field
NOT_SCORED = "likelihood_skipped"  # the step-row field saying why a step has no likelihood


def bits_per_byte(nats: float, nbytes: int) -> float | None:
    """``nats`` as bits per byte of a text of ``nbytes`` UTF-8 bytes (None for an empty text)."""
    if nbytes <= 0:
        return None
    return float(nats) / LN2 / nbytes


def likelihood_entry(nats: float, tokens: int, text: str,
                     compressor_bits: float | None = None) -> dict[str, Any]:
    """A step row's ``likelihood`` object for a response ``text`` whose ``tokens`` (its end
    marker included) cost ``nats``."""
    nbytes = len(text.encode("utf-8", "surrogatepass"))
    out: dict[str, Any] = {"nats": float(nats), "tokens": int(tokens), "bytes": nbytes,
                           "bits_per_byte": bits_per_byte(nats, nbytes)}
    if compressor_bits is not None:
        out["compressor_bits"] = float(compressor_bits)
    return out


def scored(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with a finite likelihood (what the block counts)."""
    out = []
    for r in rows:
        lk = r.get(KEY)
        if isinstance(lk, dict) and isinstance(lk.get("nats"), int | float) \
                and math.isfinite(lk["nats"]) and isinstance(lk.get("bytes"), int):
            out.append(r)
    return out


def _cluster(r: dict[str, Any]) -> str:
    c = r.get(CLUSTER)
    return str(r["trajectory_id"] if c is None else c)


def _sums(rows: Sequence[dict[str, Any]], bits: Callable[[dict], float | None],
          ids: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster (bits, bytes) of the rows where ``bits`` has a value (clusters ``ids``: a
    shared order, e.g. both sides of a paired difference)."""
    if ids is None:
        codes, ids = cluster_codes([_cluster(r) for r in rows])
    else:
        where = {c: i for i, c in enumerate(ids)}
        codes = np.array([where[_cluster(r)] for r in rows], dtype=np.int64)
    b = np.array([bits(r) if bits(r) is not None else np.nan for r in rows], dtype=float)
    n = np.array([float(r[KEY]["bytes"]) for r in rows], dtype=float)
    ok = np.isfinite(b)
    c = len(ids)
    sums = np.bincount(codes[ok], weights=b[ok], minlength=c).astype(float)
    counts = np.bincount(codes[ok], weights=n[ok], minlength=c).astype(float)
    return sums, counts


def model_bits(r: dict[str, Any]) -> float:
    """A row's code length under the model, in bits."""
    return float(r[KEY]["nats"]) / LN2


def compressor_bits(r: dict[str, Any]) -> float | None:
    """A row's code length under the primed compressor, in bits (None without a reference)."""
    v = r[KEY].get("compressor_bits")
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def _not_a_rate(est: dict[str, Any]) -> dict[str, Any]:
    """An interval of ``ratio_intervals`` for bits per byte: where the replicates had no spread
    (one cluster) there is no interval (the rate fallback, Wilson's, means nothing here)."""
    if est["method"] not in (None, BOOTSTRAP):
        est = dict(est, ci=None, method=NO_SPREAD, mc_error=None)
    return est


def pooled(rows: Sequence[dict[str, Any]], spec: IntervalSpec,
           bits: Callable[[dict], float | None] = model_bits) -> dict[str, Any]:
    """Total bits / total bytes of ``rows`` with its cluster-bootstrap interval: ``point``,
    ``ci``, ``method``, ``mc_error``, ``steps``, ``clusters``, ``bytes``, ``bits``."""
    have = [r for r in rows if bits(r) is not None]
    if not have:
        return {"point": None, "ci": None, "method": None, "mc_error": None, "steps": 0,
                "clusters": 0, "bytes": 0, "bits": 0.0}
    sums, counts = _sums(have, bits)
    if counts.sum() <= 0:  # only empty responses: no rate
        return {"point": None, "ci": None, "method": None, "mc_error": None,
                "steps": len(have), "clusters": len(sums), "bytes": 0,
                "bits": float(sums.sum())}
    est = _not_a_rate(ratio_intervals(sums[:, None], counts[:, None], spec)[0])
    return {"point": est["point"], "ci": est["ci"], "method": est["method"],
            "mc_error": est["mc_error"], "steps": len(have), "clusters": len(sums),
            "bytes": int(counts.sum()), "bits": float(sums.sum())}


def mean_step(rows: Sequence[dict[str, Any]], spec: IntervalSpec) -> dict[str, Any]:
    """The mean of each step's bits per byte (steps of at least one byte), cluster bootstrap."""
    have = [r for r in rows if r[KEY].get("bits_per_byte") is not None]
    if not have:
        return {"point": None, "ci": None, "method": None, "mc_error": None, "steps": 0}
    codes, ids = cluster_codes([_cluster(r) for r in have])
    v = np.array([float(r[KEY]["bits_per_byte"]) for r in have])
    sums = np.bincount(codes, weights=v, minlength=len(ids)).astype(float)
    counts = np.bincount(codes, minlength=len(ids)).astype(float)
    est = _not_a_rate(ratio_intervals(sums[:, None], counts[:, None], spec)[0])
    return {"point": est["point"], "ci": est["ci"], "method": est["method"],
            "mc_error": est["mc_error"], "steps": len(have)}


def _group(rows: Sequence[dict[str, Any]], spec: IntervalSpec, ref: bool) -> dict[str, Any]:
    g = pooled(rows, spec)
    out = {"n": len(rows), "clusters": g["clusters"], "bits_per_byte": g["point"],
           "ci": g["ci"], "method": g["method"]}
    if ref:
        c = pooled(rows, spec, compressor_bits)
        out["compressor_bits_per_byte"] = c["point"]
        out["compressor_ci"] = c["ci"]
    return out


def _grouped(rows: Sequence[dict[str, Any]], label: Callable[[dict], Any], spec: IntervalSpec,
             ref: bool) -> dict[str, Any]:
    buckets: dict[Any, list[dict]] = defaultdict(list)
    for r in rows:
        buckets[label(r)].append(r)
    order = sorted(buckets, key=lambda k: (not isinstance(k, int), k if isinstance(k, int)
                                           else str(k)))
    return {str(k): _group(buckets[k], spec, ref) for k in order}


def _no_newcombe(d: dict[str, Any]) -> dict[str, Any]:
    """A difference's ``ci`` and ``method``; no interval where the replicates had no spread
    (the rate fallback, Newcombe's, means nothing for bits per byte)."""
    if d["method"] == BOOTSTRAP:
        return {"ci": d["ci"], "method": d["method"]}
    return {"ci": None, "method": NO_SPREAD if d["method"] else None}


def model_minus_compressor(rows: Sequence[dict[str, Any]], spec: IntervalSpec
                           ) -> dict[str, Any] | None:
    """Model − compressor bits per byte on the steps both scored, paired (clusters resampled
    together); None without a reference."""
    both = [r for r in rows if compressor_bits(r) is not None]
    if not both:
        return None
    _, ids = cluster_codes([_cluster(r) for r in both])
    a = _sums(both, compressor_bits, ids)
    b = _sums(both, model_bits, ids)
    if a[1].sum() <= 0:
        return None
    d = ratio_difference((a[0][:, None], a[1][:, None]), (b[0][:, None], b[1][:, None]), spec,
                         paired=True)[0]
    return {"diff": d["diff"], **_no_newcombe(d), "p_value": d["p_value"],
            "mc_error": d["mc_error"], "steps": len(both)}


def likelihood_block(rows: Sequence[dict[str, Any]], spec: IntervalSpec) -> dict[str, Any] | None:
    """The summary's ``likelihood`` block of the step rows (each with ``cluster`` assigned), or
    None when no row has a likelihood. Depth is the call's index in its trajectory (``step``):
    every real call is scored."""
    have = scored(rows)
    skipped = Counter(str(r.get(NOT_SCORED)) for r in rows if r.get(NOT_SCORED))
    if not have and not skipped:
        return None
    ref = any(compressor_bits(r) is not None for r in have)
    model = pooled(have, spec)
    out: dict[str, Any] = {
        "unit": "bits per byte of the response's UTF-8 text; the model's code length covers "
                "its tokens and the closing end-of-message token",
        "steps": len(have),
        "trajectories": len({str(r["trajectory_id"]) for r in have}),
        "clusters": model["clusters"],
        "nats": float(sum(float(r[KEY]["nats"]) for r in have)),
        "tokens": int(sum(int(r[KEY]["tokens"]) for r in have)),
        "bytes": int(sum(int(r[KEY]["bytes"]) for r in have)),
        "bits_per_byte": {k: model[k] for k in ("point", "ci", "method", "mc_error")},
        "mean_step_bits_per_byte": mean_step(have, spec),
        "not_scored": dict(skipped.most_common()),
    }
    if ref:
        comp = pooled(have, spec, compressor_bits)
        out["compressor"] = {
            "method": "raw deflate (zlib level 9) with a preset dictionary of the train split's "
                      "responses of the same tool (audit.worlds.compressor)",
            "bits_per_byte": {k: comp[k] for k in ("point", "ci", "method", "mc_error")},
            "steps": comp["steps"]}
        out["model_minus_compressor"] = model_minus_compressor(have, spec)
    out["by_depth"] = _grouped(have, lambda r: int(r["step"]), spec, ref)
    out["by_tool"] = _grouped(have, lambda r: str(r["tool"]), spec, ref)
    out["by_mutates_state"] = _grouped(have, lambda r: stratum_label(r, "mutates_state"), spec,
                                       ref)
    out["by_novelty"] = _grouped(have, lambda r: stratum_label(r, "novelty"), spec, ref)
    return out


def _call_key(r: dict[str, Any]) -> str:
    import json

    return json.dumps([r.get("task_id"), r.get("step"), r.get("tool"), r.get("arguments")],
                      sort_keys=True, default=str)


def compare_likelihood(rows_a: Sequence[dict[str, Any]], rows_b: Sequence[dict[str, Any]],
                       spec: IntervalSpec) -> dict[str, Any] | None:
    """B − A bits per byte on the calls both likelihood audits scored (same task, step, tool
    and arguments), paired: clusters (A's) resampled together. None unless both have one."""
    a, b = scored(rows_a), scored(rows_b)
    if not a or not b:
        return None
    index_b = {_call_key(r): r for r in b}
    pairs = [(r, index_b[_call_key(r)]) for r in a if _call_key(r) in index_b]
    out: dict[str, Any] = {"a": pooled(a, spec)["point"], "b": pooled(b, spec)["point"],
                           "pairs": len(pairs)}
    if not pairs:
        out["note"] = "no call scored in both audits: no paired difference"
        return out
    _, ids = cluster_codes([_cluster(x) for x, _ in pairs])
    left = [dict(y, **{CLUSTER: _cluster(x)}) for x, y in pairs]  # B's rows in A's clusters
    sa = _sums([x for x, _ in pairs], model_bits, ids)
    sb = _sums(left, model_bits, ids)
    if sa[1].sum() <= 0:
        out["note"] = "the paired calls have no bytes"
        return out
    d = ratio_difference((sa[0][:, None], sa[1][:, None]), (sb[0][:, None], sb[1][:, None]),
                         spec, paired=True)[0]
    out.update({"paired_a": d["a"], "paired_b": d["b"], "diff": d["diff"], **_no_newcombe(d),
                "p_value": d["p_value"], "test": d.get("test"),
                "mc_error": d["mc_error"], "clusters": len(ids)})
    return out
