"""The first divergence as a survival curve: Kaplan–Meier estimate of S(t) = P(no divergence at
depths 0..t), its interval a cluster bootstrap of the whole curve (Greenwood's, which counts
trajectories as independent, is kept beside it as ``greenwood_ci``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from audit.stats.intervals import (
    BOOTSTRAP,
    IntervalSpec,
    TrajectoryResamples,
    cluster_codes,
    mc_error,
)
from audit.stats.steps import Step, by_trajectory, clean, cluster_of, depth_of, scored_steps

GREENWOOD = "greenwood"  # a survival interval that counts trajectories as independent


def _km_times(steps: Iterable[Step]) -> tuple[list[tuple[int, bool]], list[object]]:
    """Per trajectory (ids sorted): (depth of its first divergence or of its last step, event),
    and its resampling cluster."""
    times: list[tuple[int, bool]] = []
    clusters: list[object] = []
    for group in by_trajectory(scored_steps(steps)).values():
        first = next((depth_of(s) for s in group if s["diverged"]), None)
        times.append((first, True) if first is not None else (depth_of(group[-1]), False))
        clusters.append(cluster_of(group[0]))
    return times, clusters


def _greenwood_ci(surv: float, greenwood: float, z: float) -> list[float]:
    if 0.0 < surv < 1.0:
        se = math.sqrt(greenwood) / abs(math.log(surv))
        return [surv ** math.exp(z * se), surv ** math.exp(-z * se)]
    return [surv, surv]


def _km_bootstrap(times: list[tuple[int, bool]], clusters: list[object], depths: int,
                  spec: IntervalSpec, resamples: TrajectoryResamples | None
                  ) -> np.ndarray:
    """``(B x depths)`` Kaplan–Meier curves of cluster resamples: per cluster the trajectories
    at risk and the events at each depth, summed with each resample's multiplicities. A
    resample with nobody at risk at a depth keeps its curve's last value (the estimator's own
    convention past its last observation)."""
    codes, ids = cluster_codes(clusters)
    at_risk = np.zeros((len(ids), depths))
    events = np.zeros((len(ids), depths))
    for c, (u, e) in zip(codes, times, strict=True):
        at_risk[c, : u + 1] += 1
        if e:
            events[c, u] += 1
    res = resamples if resamples is not None and resamples.n_clusters == len(ids) \
        else TrajectoryResamples(len(ids), spec)
    parts = []
    for w in res.batches():
        wf = w.astype(float)
        n, d = wf @ at_risk, wf @ events
        with np.errstate(divide="ignore", invalid="ignore"):
            hazard = np.where(n > 0, d / np.where(n > 0, n, 1.0), 0.0)
        parts.append(np.cumprod(1.0 - hazard, axis=1))
    return np.concatenate(parts) if parts else np.empty((0, depths))


def first_divergence_survival(steps: Iterable[Step], z: float = 1.96,
                              spec: IntervalSpec | None = None,
                              resamples: TrajectoryResamples | None = None) -> dict:
    """Kaplan–Meier estimate of S(t) = P(no divergence at depths 0..t).

    Per trajectory the event is its first diverged step; a trajectory that never diverged is
    censored at its last step (it was observed not to diverge there). Rows per depth hold
    ``at_risk``, ``events``, ``censored``, ``hazard`` (events / at_risk), ``survival`` and its
    interval ``ci``: the percentile interval of a cluster bootstrap of the whole curve
    (``spec``: resamples, seed, level and unit; a trajectory's cluster is its steps'
    ``cluster``, else the trajectory itself; ``resamples``: the summary's shared resamples of
    the same clusters), widened to hold the point, with ``ci_mc_error``. Where the
    resamples have no spread (one cluster, or S of 0 or 1) the interval is Greenwood's on the
    log(−log) scale (``ci_method`` ``"greenwood"``), which counts each trajectory as one
    independent observation; ``greenwood_ci`` gives that interval at every depth for
    comparison. ``median`` is the first depth with S ≤ 0.5 (None if the curve never gets
    there).
    """
    spec = spec or IntervalSpec()
    times, clusters = _km_times(steps)
    depths = max((t for t, _ in times), default=-1) + 1
    reps = (_km_bootstrap(times, clusters, depths, spec, resamples)
            if depths and spec.resamples > 0 else np.empty((0, depths)))
    a = (1 - spec.level) / 2
    rows, surv, greenwood, median = [], 1.0, 0.0, None
    for t in range(depths):
        at_risk = sum(1 for u, _ in times if u >= t)
        if at_risk == 0:
            break
        events = sum(1 for u, e in times if u == t and e)
        censored = sum(1 for u, e in times if u == t and not e)
        surv *= 1 - events / at_risk
        greenwood += events / (at_risk * (at_risk - events)) if at_risk > events else math.inf
        gw = _greenwood_ci(surv, greenwood, z)
        col = reps[:, t] if len(reps) else reps[:, :0].ravel()
        if len(col) and float(col.max() - col.min()) > 1e-12:
            lo, hi = np.quantile(col, [a, 1 - a])
            ci: list[float] = [min(float(lo), surv), max(float(hi), surv)]
            method, err = BOOTSTRAP, mc_error(col, spec.level)
        else:
            ci, method, err = gw, GREENWOOD, None
        if median is None and surv <= 0.5:
            median = t
        rows.append(
            {
                "depth": t,
                "at_risk": at_risk,
                "events": events,
                "censored": censored,
                "hazard": events / at_risk,
                "survival": surv,
                "ci": ci,
                "ci_method": method,
                "ci_mc_error": err,
                "greenwood_ci": gw,
            }
        )
    n_events = sum(e for _, e in times)
    return clean(
        {
            "rows": rows,
            "median": median,
            "n_trajectories": len(times),
            "n_events": n_events,
            "n_censored": len(times) - n_events,
            "clusters": len(set(map(str, clusters))),
            "resampling_unit": spec.unit,
            "ci_kind": f"percentile interval of a bootstrap of the whole curve resampling "
                       f"clusters (unit: {spec.unit}; {spec.resamples} resamples, seed "
                       f"{spec.seed}); greenwood_ci treats trajectories as independent",
        }
    )
