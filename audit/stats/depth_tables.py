"""Divergence and mean scores per group of steps, with cluster-bootstrap intervals: by depth
(:func:`by_depth`), by tool, read/write or novelty bin (:func:`strata`), or any group
(:func:`group_stats`). :class:`StepTable` holds the scored steps as arrays, built once, so that
every table of one summary shares one set of cluster resamples (``audit.stats.intervals``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from audit.stats.intervals import (
    IntervalSpec,
    TrajectoryResamples,
    cluster_codes,
    cluster_sums,
    ratio_intervals,
)
from audit.stats.steps import (
    Step,
    clean,
    cluster_of,
    depth_of,
    is_finite,
    score_of,
    scored_steps,
    scorer_names,
)

NOVELTY_BINS = (0.0, 0.25, 0.5, 0.75, 1.0)


class StepTable:
    """Scored steps as arrays, built once: trajectory code, diverged and scores per step."""

    def __init__(self, steps: Sequence[Step], scorers: Sequence[str], spec: IntervalSpec) -> None:
        self.steps, self.scorers, self.spec = steps, list(scorers), spec
        n = len(steps)
        self.codes, self.ids = cluster_codes([cluster_of(s) for s in steps])
        self.traj_codes, _ = cluster_codes([s.get("trajectory_id") for s in steps])
        cols = [np.fromiter((bool(s["diverged"]) for s in steps), dtype=float, count=n)]
        cols += [np.fromiter((score_of(s, m) for s in steps), dtype=float, count=n)
                 for m in self.scorers]
        self.values = np.stack(cols, axis=1) if n else np.empty((0, 1 + len(self.scorers)))
        self.resamples = (TrajectoryResamples(len(self.ids), spec)
                          if n and spec.resamples > 0 else None)

    def stats(self, rows: Sequence[int] | None) -> dict:
        """:func:`group_stats` of the steps at these row indices (None: all)."""
        idx = np.arange(len(self.steps)) if rows is None else np.asarray(rows, dtype=np.int64)
        n = len(idx)
        values = self.values[idx]
        k = int(values[:, 0].sum()) if n else 0
        out: dict = {"n": n, "trajectories": 0, "diverged": k, "divergence_rate": None,
                     "divergence_ci": None, "divergence_ci_method": None,
                     "scores": {name: {"mean": None, "ci": None, "n": 0, "method": None}
                                for name in self.scorers},
                     "clusters": 0, "divergence_ci_mc_error": None}
        if not n:
            return out
        uniq, local = np.unique(self.codes[idx], return_inverse=True)
        sums, counts = cluster_sums(local.reshape(-1), values, len(uniq))
        res = ratio_intervals(sums, counts, self.spec, self.resamples,
                              None if len(uniq) == len(self.ids) else uniq,
                              binary=[True] + [False] * len(self.scorers))
        out.update(trajectories=len(np.unique(self.traj_codes[idx])), divergence_rate=k / n,
                   divergence_ci=res[0]["ci"], divergence_ci_method=res[0]["method"],
                   clusters=len(uniq), divergence_ci_mc_error=res[0]["mc_error"])
        for name, r in zip(self.scorers, res[1:], strict=True):
            out["scores"][name] = {"mean": r["point"], "ci": r["ci"], "n": r["n"],
                                   "method": r["method"], "mc_error": r["mc_error"]}
        return out

    def grouped(self, label: Callable[[Step], object]) -> dict:
        groups: dict[object, list[int]] = defaultdict(list)
        for i, s in enumerate(self.steps):
            groups[label(s)].append(i)
        return {g: self.stats(groups[g]) for g in sorted(groups)}


def group_stats(steps: Sequence[Step], scorers: Sequence[str],
                spec: IntervalSpec = IntervalSpec()) -> dict:
    """n, trajectories, diverged, divergence rate and each scorer's mean, with intervals that
    resample the group's trajectories (``audit.stats.intervals``; method per figure)."""
    return StepTable(list(steps), scorers, spec).stats(None)


def depth_rows(table: StepTable) -> list[dict]:
    return clean([{"depth": d, **v} for d, v in table.grouped(depth_of).items()])


def by_depth(steps: Iterable[Step], scorers: Sequence[str] | None = None,
             spec: IntervalSpec = IntervalSpec()) -> list[dict]:
    """One row per depth: n, diverged, divergence_rate, mean of each scorer, with intervals."""
    steps = scored_steps(steps)
    return depth_rows(StepTable(steps, scorer_names(steps, scorers), spec))


def stratum_label(step: Step, key: str, bins: Sequence[float] = NOVELTY_BINS) -> str:
    """A step's stratum: read / write / unknown, a novelty bin `lo-hi`, or the field's value."""
    if key == "mutates_state":
        value = step.get("mutates_state")
        return "unknown" if value is None else ("write" if value else "read")
    if key == "novelty":
        value = step.get("novelty")
        if not is_finite(value):
            return "unknown"
        for lo, hi in zip(bins[:-1], bins[1:], strict=True):
            if lo <= value < hi or (hi == bins[-1] and value == hi):
                return f"{lo:.2f}-{hi:.2f}"
        return "out of range"
    value = step.get(key)
    return "unknown" if value is None else str(value)


def strata(
    steps: Iterable[Step],
    key: str | Callable[[Step], str],
    scorers: Sequence[str] | None = None,
    bins: Sequence[float] = NOVELTY_BINS,
    spec: IntervalSpec = IntervalSpec(),
) -> dict[str, dict]:
    """Divergence and mean scores per stratum, keyed by stratum label (sorted).

    ``key``: ``"mutates_state"`` (labels read / write / unknown), ``"novelty"`` (bins
    ``[lo, hi)``, the last closed), any other record field (e.g. ``"tool"``), or a function.
    """
    steps = scored_steps(steps)
    return table_strata(StepTable(steps, scorer_names(steps, scorers), spec), key, bins)


def table_strata(table: StepTable, key: str | Callable[[Step], str], bins: Sequence[float]
            ) -> dict[str, dict]:
    label = key if callable(key) else (lambda s: stratum_label(s, key, bins))
    return clean(table.grouped(label))
