"""Does the world model know when it is wrong? Confidence, calibration and selective rehearsal.

Wherever a rehearsed response has the log-probability the model gave it while writing it (a
rollout's tool message, ``logprob`` and ``num_tokens``; the generation probe, which scores its
own answers), its step row carries ``confidence``: the **mean token log-probability** of the
response (its tokens and the closing end marker; ``logprob / num_tokens``). The summary's
``confidence`` block says how well it predicts divergence:

- ``auroc``: the probability that a diverged step has lower confidence than a right one (ties
  count half; 0.5 is no information), with a cluster-bootstrap interval (the audit's unit);
- ``reliability``: steps binned by exp(confidence), the geometric-mean token probability, with
  each bin's share of right responses (a calibrated model's bins lie on the diagonal);
- ``risk_coverage``: trusting only the rehearsals with confidence ≥ c (the rest go to the real
  environment), the share covered and the share of those that diverge, at every distinct c;
- ``coverage_at_risk``: the largest coverage whose risk is at most 1 %, 5 %, 10 % (the headline:
  how many calls a user can leave to the simulator at that error).

Why the mean and not the minimum token log-probability: the trajectory format records the sum
and the count (``logprob``, ``num_tokens``), so the mean is available for every rollout and
rehearsal ever written, the minimum only where per-token figures are kept; the mean does not
fall with length alone as the sum does. The probe records the minimum too (``confidence_min``)
and the block gives its AUROC beside the default's (``auroc_min``) so the choice can be checked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from audit.stats.clusters import CLUSTER
from audit.stats.intervals import IntervalSpec, cluster_codes, mc_error, resample_weights

KEY = "confidence"
MIN_KEY = "confidence_min"
RISKS = (0.01, 0.05, 0.10)
BINS = 10


def mean_token_logprob(logprob: Any, num_tokens: Any) -> float | None:
    """``logprob / num_tokens`` when both are usable numbers (tokens > 0), else None."""
    if isinstance(logprob, bool) or not isinstance(logprob, int | float) \
            or not math.isfinite(logprob):
        return None
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens <= 0:
        return None
    return float(logprob) / num_tokens


class Rehearsal(str):
    """A world model's answer that carries the log-probability it was written with: the sum
    over its tokens and end marker (``logprob``), their count (``num_tokens``) and the lowest
    token's (``min_logprob``). A plain ``str`` everywhere else."""

    logprob: float | None = None
    num_tokens: int | None = None
    min_logprob: float | None = None

    @classmethod
    def of(cls, text: str, logprob: float, num_tokens: int,
           min_logprob: float | None = None) -> Rehearsal:
        out = cls(text)
        out.logprob, out.num_tokens, out.min_logprob = logprob, num_tokens, min_logprob
        return out


def confidence_of(answer: Any) -> dict[str, float]:
    """The step-row fields of an answer: ``confidence`` (and ``confidence_min``) when it is a
    `Rehearsal` with usable figures, else nothing."""
    if not isinstance(answer, Rehearsal):
        return {}
    out: dict[str, float] = {}
    conf = mean_token_logprob(answer.logprob, answer.num_tokens)
    if conf is not None:
        out[KEY] = conf
        m = answer.min_logprob
        if isinstance(m, int | float) and not isinstance(m, bool) and math.isfinite(m):
            out[MIN_KEY] = float(m)
    return out


def weighted_auroc(score: np.ndarray, positive: np.ndarray, weight: np.ndarray) -> float | None:
    """P(score of a positive > score of a negative) + half the ties, each step weighted (a
    bootstrap multiplicity); None without both classes."""
    wp = float(weight[positive].sum())
    wn = float(weight[~positive].sum())
    if wp <= 0 or wn <= 0:
        return None
    # per distinct score: positives beat every negative of a lower score, half the tied ones
    _, group = np.unique(score, return_inverse=True)
    wpos = np.bincount(group, weights=np.where(positive, weight, 0.0))
    wneg = np.bincount(group, weights=np.where(positive, 0.0, weight))
    below = np.cumsum(wneg) - wneg
    total = float((wpos * (below + 0.5 * wneg)).sum())
    return total / (wp * wn)


def auroc(confidence: Sequence[float], diverged: Sequence[bool]) -> float | None:
    """AUROC of *low* confidence predicting divergence (unweighted)."""
    c = np.asarray(confidence, dtype=float)
    return weighted_auroc(-c, np.asarray(diverged, dtype=bool), np.ones(len(c)))


def auroc_interval(confidence: Sequence[float], diverged: Sequence[bool],
                   clusters: Sequence[object], spec: IntervalSpec) -> dict[str, Any]:
    """The AUROC with a percentile interval of the cluster bootstrap (whole clusters drawn)."""
    c = -np.asarray(confidence, dtype=float)
    y = np.asarray(diverged, dtype=bool)
    point = weighted_auroc(c, y, np.ones(len(c)))
    out: dict[str, Any] = {"point": point, "ci": None, "method": None, "mc_error": None,
                           "n": len(c), "diverged": int(y.sum())}
    if point is None or spec.resamples <= 0:
        return out
    codes, ids = cluster_codes(clusters)
    reps = []
    for w in resample_weights(len(ids), spec.resamples, spec.seed):
        for row in w:
            v = weighted_auroc(c, y, row[codes].astype(float))
            if v is not None:
                reps.append(v)
    r = np.asarray(reps)
    if len(r) >= 2 and r.max() - r.min() > 1e-12:
        a = (1 - spec.level) / 2
        lo, hi = np.quantile(r, [a, 1 - a])
        out.update(ci=[min(float(lo), point), max(float(hi), point)],
                   method="trajectory_bootstrap", mc_error=mc_error(r, spec.level))
    else:
        out["method"] = "no_spread"
    out["clusters"] = len(ids)
    return out


def risk_coverage(confidence: Sequence[float], diverged: Sequence[bool]) -> list[dict[str, Any]]:
    """For each distinct confidence c (highest first): trusting the steps with confidence ≥ c,
    the share covered and the share of those that diverged."""
    c = np.asarray(confidence, dtype=float)
    y = np.asarray(diverged, dtype=bool)
    n = len(c)
    out = []
    for t in np.unique(c)[::-1]:
        kept = c >= t
        k = int(kept.sum())
        out.append({"threshold": float(t), "coverage": k / n, "risk": float(y[kept].sum()) / k,
                    "covered": k})
    return out


def coverage_at_risk(curve: Sequence[dict[str, Any]], risks: Sequence[float] = RISKS
                     ) -> dict[str, dict[str, Any]]:
    """Per risk r: the largest coverage whose risk is ≤ r, and its threshold (none: 0)."""
    out = {}
    for r in risks:
        ok = [p for p in curve if p["risk"] <= r + 1e-12]
        best = max(ok, key=lambda p: p["coverage"]) if ok else None
        out[f"{r:.0%}"] = {"coverage": best["coverage"] if best else 0.0,
                           "threshold": best["threshold"] if best else None}
    return out


def reliability(confidence: Sequence[float], diverged: Sequence[bool], bins: int = BINS
                ) -> list[dict[str, Any]]:
    """Steps in equal-width bins of exp(confidence) (the geometric-mean token probability):
    each bin's mean of it and its share of right (not diverged) responses."""
    p = np.clip(np.exp(np.asarray(confidence, dtype=float)), 0.0, 1.0)
    y = np.asarray(diverged, dtype=bool)
    edges = np.linspace(0.0, 1.0, bins + 1)
    out = []
    for k in range(bins):
        lo, hi = edges[k], edges[k + 1]
        m = (p >= lo) & ((p < hi) if k < bins - 1 else (p <= hi))
        if m.any():
            out.append({"bin": [float(lo), float(hi)], "n": int(m.sum()),
                        "mean_probability": float(p[m].mean()),
                        "right": float((~y[m]).mean())})
    return out


def confidence_block(rows: Sequence[dict[str, Any]], spec: IntervalSpec) -> dict[str, Any] | None:
    """The summary's ``confidence`` block over the scored rows that carry a confidence (each
    with ``cluster`` assigned); None when none does."""
    have = [r for r in rows if isinstance(r.get(KEY), int | float) and math.isfinite(r[KEY])]
    if not have:
        return None
    conf = [float(r[KEY]) for r in have]
    div = [bool(r["diverged"]) for r in have]
    clusters = [str(r.get(CLUSTER, r["trajectory_id"])) for r in have]
    curve = risk_coverage(conf, div)
    out: dict[str, Any] = {
        "measure": "mean token log-probability of the rehearsed response (logprob / num_tokens)",
        "steps": len(have), "of_scored_steps": len(rows),
        "divergence_rate": sum(div) / len(div),
        "auroc": auroc_interval(conf, div, clusters, spec),
        "coverage_at_risk": coverage_at_risk(curve),
        "reliability": reliability(conf, div),
        "risk_coverage": _thin(curve),
    }
    mins = [r for r in have if isinstance(r.get(MIN_KEY), int | float)]
    if len(mins) == len(have):
        out["auroc_min"] = auroc([float(r[MIN_KEY]) for r in have], div)
    return out


def _thin(curve: list[dict[str, Any]], points: int = 101) -> list[dict[str, Any]]:
    """At most ``points`` points of the curve (evenly by index, the ends kept)."""
    if len(curve) <= points:
        return curve
    idx = sorted({round(i * (len(curve) - 1) / (points - 1)) for i in range(points)})
    return [curve[i] for i in idx]
