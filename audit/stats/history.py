"""Error compounding, isolated: the same calls rehearsed with the real history and with the
world model's own.

    pairs = pair_verdicts(real_rows, own_rows)     # steps.jsonl rows of the two probes
    block = decompose(pairs, IntervalSpec(1000, 0))   # the summary's "history" block

A rising divergence by depth mixes two causes: later steps may be harder, and the model may be
misled by its own earlier (wrong) answers. The teacher-forced probe rehearses every ground-truth
call given the *real* history (``history: real``); the self-conditioned probe rehearses the same
calls given the history of its *own* earlier rehearsed responses (``history: own``). Paired step
by step, their difference at a depth is what the model's own history costs there (compounding);
what the real-history divergence already shows is difficulty.

Per group (overall, each depth, read/write, novelty bin, and depth >= ``DEEP``):

- ``real``, ``own``: divergence rates with trajectory-bootstrap intervals
(``audit.stats.intervals``);
- ``diff``: own - real, paired (both probes hold the same steps; whole trajectories are
  resampled together), with interval and two-sided bootstrap p-value; the percentile interval
  is never narrower than a score interval of the discordant calls (`discordant_interval`);
- ``induced``: the share of the self-conditioned divergences that fall on steps the model got
  right with the real history (errors its own history caused); ``recovered``: the share of the
  real-history divergences that its own history got right;
- ``compounding_share`` (depth >= ``DEEP`` and overall): (own - real) / own, the part of the
  self-conditioned divergence that the real history removes, with a bootstrap interval.

Pure functions: rows in, a JSON-ready dict out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from audit.stats.intervals import (
    BOOTSTRAP,
    SIGN_FLIP,
    IntervalSpec,
    TrajectoryResamples,
    _column_percentiles,
    cluster_codes,
    cluster_sums,
    mc_error,
    ratio_difference,
    ratio_intervals,
    wilson_ci,
)

HISTORIES = ("real", "own")
#: the paired difference's interval when the bootstrap replicates have no spread
DISCORDANT = "newcombe_discordant_effective"
DEEP = 3  # "deep" steps: depth >= DEEP
NOVELTY_EDGES = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Pair:
    """One ground-truth call's two verdicts."""

    trajectory: str
    step: int
    depth: int
    real: bool  # diverged given the real history
    own: bool  # diverged given its own history
    write: bool | None = None  # the tool mutates state (None: unknown)
    novelty: float | None = None
    cluster: str | None = None  # the resampling unit's cluster (None: the trajectory)


def _key(row: dict[str, Any]) -> tuple[str, int]:
    return str(row.get("trajectory_id")), int(row.get("step") or 0)


def _usable(row: dict[str, Any]) -> bool:
    return isinstance(row.get("diverged"), bool) and not row.get("unanswered")


def pair_verdicts(real_rows: Iterable[dict[str, Any]], own_rows: Iterable[dict[str, Any]]
                  ) -> list[Pair]:
    """Pair the two probes' step rows by (trajectory, step); steps either probe could not
    answer or score are left out of both. Depth is each pair's index among its trajectory's
    kept pairs, in step order."""
    real = {_key(r): r for r in real_rows if _usable(r)}
    own = {_key(r): r for r in own_rows if _usable(r)}
    keys = sorted(set(real) & set(own))
    pairs: list[Pair] = []
    depth: dict[str, int] = {}
    for t, s in keys:
        r, o = real[(t, s)], own[(t, s)]
        d = depth.get(t, 0)
        depth[t] = d + 1
        nov = r.get("novelty")
        cluster = r.get("cluster")
        pairs.append(Pair(t, s, d, bool(r["diverged"]), bool(o["diverged"]),
                          r.get("mutates_state"),
                          float(nov) if isinstance(nov, int | float) else None,
                          None if cluster is None else str(cluster)))
    return pairs


def _novelty_bin(v: float | None) -> str:
    if v is None or not np.isfinite(v):
        return "unknown"
    for lo, hi in zip(NOVELTY_EDGES[:-1], NOVELTY_EDGES[1:], strict=True):
        if lo <= v < hi or (hi == NOVELTY_EDGES[-1] and v == hi):
            return f"{lo:.2f}-{hi:.2f}"
    return "out of range"


class _Data:
    """The pairs as per-trajectory sums: columns real, own, induced (own & not real),
    recovered (real & not own)."""

    def __init__(self, pairs: Sequence[Pair], spec: IntervalSpec) -> None:
        self.pairs, self.spec = list(pairs), spec
        self.codes, self.ids = cluster_codes(
            [p.trajectory if p.cluster is None else p.cluster for p in self.pairs])
        self.traj_codes, _ = cluster_codes([p.trajectory for p in self.pairs])
        self.c = len(self.ids)
        self.shared = TrajectoryResamples(self.c, spec) if spec.resamples > 0 and self.c else None
        real = np.array([p.real for p in self.pairs], dtype=float)
        own = np.array([p.own for p in self.pairs], dtype=float)
        self.values = np.stack([real, own, own * (1 - real), real * (1 - own)], axis=1) \
            if self.pairs else np.zeros((0, 4))

    def group(self, keep: Callable[[Pair], bool]) -> dict[str, Any] | None:
        mask = np.array([keep(p) for p in self.pairs], dtype=bool)
        if not mask.any():
            return None
        members = np.unique(self.codes[mask])
        remap = {int(c): i for i, c in enumerate(members)}
        codes = np.array([remap[int(c)] for c in self.codes[mask]], dtype=np.int64)
        sums, counts = cluster_sums(codes, self.values[mask], len(members))
        out = self._figures(sums, counts, members)
        out["trajectories"] = int(len(np.unique(self.traj_codes[mask])))
        out["clusters"] = int(len(members))
        return out

    def _figures(self, sums: np.ndarray, counts: np.ndarray, members: np.ndarray
                 ) -> dict[str, Any]:
        spec = self.spec
        rates = ratio_intervals(sums[:, :2], counts[:, :2], spec, self.shared, members,
                                binary=[True, True])
        n_real, n_own = float(sums[:, 0].sum()), float(sums[:, 1].sum())
        diff = ratio_difference((sums[:, [0]], counts[:, [0]]), (sums[:, [1]], counts[:, [1]]),
                                spec, paired=True)[0]
        diff = _with_discordant_floor(diff, sums[:, 2], sums[:, 3], counts[:, 0], spec.z)
        # induced = own&!real / own ; recovered = real&!own / real (per-trajectory ratios)
        induced = ratio_intervals(sums[:, [2]], sums[:, [1]], spec, self.shared, members,
                                  binary=[True])[0]
        recovered = ratio_intervals(sums[:, [3]], sums[:, [0]], spec, self.shared, members,
                                    binary=[True])[0]
        out = {
            "n": int(round(float(counts[:, 0].sum()))),
            "trajectories": int((counts[:, 0] > 0).sum()),
            "real": rates[0], "own": rates[1],
            "diff": {k: diff.get(k) for k in ("diff", "ci", "p_value", "method", "test",
                                              "mc_error")},
            "diverged_real": int(round(n_real)), "diverged_own": int(round(n_own)),
            "induced": {**induced, "count": int(round(float(sums[:, 2].sum())))},
            "recovered": {**recovered, "count": int(round(float(sums[:, 3].sum())))},
        }
        return out

    def compounding_share(self, keep: Callable[[Pair], bool]) -> dict[str, Any]:
        """(own - real) / own over the kept pairs, with a paired trajectory-bootstrap interval."""
        mask = np.array([keep(p) for p in self.pairs], dtype=bool)
        own = float(self.values[mask, 1].sum()) if mask.any() else 0.0
        if own <= 0:
            return {"point": None, "ci": None, "method": None,
                    "note": "no self-conditioned divergence in this group"}
        point = (own - float(self.values[mask, 0].sum())) / own
        members = np.unique(self.codes[mask])
        remap = {int(c): i for i, c in enumerate(members)}
        codes = np.array([remap[int(c)] for c in self.codes[mask]], dtype=np.int64)
        sums, _ = cluster_sums(codes, self.values[mask][:, :2], len(members))
        ci, method, err = None, None, None
        if self.shared is not None:
            # numerator own - real and denominator own, resampled together
            num = (sums[:, [1]] - sums[:, [0]])
            reps = self.shared.replicates(members, num, sums[:, [1]])
            bounds = _column_percentiles(reps, self.spec.level)[0]
            if bounds is not None:
                ci, method = [min(bounds[0], point), max(bounds[1], point)], \
                    "trajectory_bootstrap"
                err = mc_error(reps[:, 0], self.spec.level)
        out = {"point": point, "ci": ci, "method": method, "mc_error": err}
        if ci is None:
            out["note"] = "no interval: the resamples have no spread (too few trajectories)"
        if own < 10:
            out["note"] = (out.get("note", "") + "; " if "note" in out else "") + (
                f"only {int(own)} own-history divergences: the share is unreliable (biased "
                "upward in small samples)")
        return out


def discordant_interval(induced: np.ndarray, recovered: np.ndarray, counts: np.ndarray,
                        z: float) -> list[float] | None:
    """A score interval of the paired difference own − real = (induced − recovered) / n.

    Per trajectory ``i``: ``induced[i]`` calls wrong only with its own history,
    ``recovered[i]`` wrong only with the real one, ``counts[i]`` paired calls. Newcombe's
    hybrid of the two discordant rates' Wilson intervals, each with the effective sample size
    of the difference (Kish: n / design effect, the cluster-robust over the iid variance of the
    per-call difference; the number of trajectories when there is no discordance or no
    spread). A percentile bootstrap of a rare-event difference undercovers when few
    trajectories hold the discordant calls (0.82 for 95 % with 25 trajectories in
    tests/audit/test_history_coverage.py); widened to contain this interval, it covers."""
    n = float(counts.sum())
    if n <= 0:
        return None
    k1, k2 = float(induced.sum()), float(recovered.sum())
    p1, p2 = k1 / n, k2 / n
    d = p1 - p2
    iid = ((k1 + k2) / n - d * d) / n
    robust = float(((induced - recovered - d * counts) ** 2).sum()) / (n * n)
    n_eff = n * iid / robust if iid > 0 and robust > 0 else float((counts > 0).sum())
    l1, u1 = wilson_ci(p1 * n_eff, n_eff, z)
    l2, u2 = wilson_ci(p2 * n_eff, n_eff, z)
    if l1 is None or l2 is None:
        return None
    return [d - float(np.hypot(p1 - l1, u2 - p2)), d + float(np.hypot(u1 - p1, p2 - l2))]


def _with_discordant_floor(diff: dict[str, Any], induced: np.ndarray, recovered: np.ndarray,
                           counts: np.ndarray, z: float) -> dict[str, Any]:
    """The paired difference's interval: the percentile bootstrap widened to contain
    `discordant_interval`; with no bootstrap spread, that interval alone (not the unpaired
    Newcombe of `ratio_difference`, which ignores the pairing)."""
    if diff.get("diff") is None or diff.get("ci") is None:
        return diff
    floor = discordant_interval(induced, recovered, counts, z)
    if floor is None:
        return diff
    d = diff["diff"]
    if diff["method"] == BOOTSTRAP:
        ci = [min(diff["ci"][0], floor[0], d), max(diff["ci"][1], floor[1], d)]
        return {**diff, "ci": ci}
    # no spread: the replicates test nothing (one trajectory would read p = 2 / (B + 1));
    # an exact sign-flip p-value stands (it needs no replicates)
    exact = diff.get("test") == SIGN_FLIP
    return {**diff, "ci": [min(floor[0], d), max(floor[1], d)], "method": DISCORDANT,
            "p_value": diff["p_value"] if exact else None,
            "test": diff.get("test") if exact else None}


def split_histories(rows: list[dict[str, Any]], spec: IntervalSpec = IntervalSpec()
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any] | None]:
    """An audit's rows as (the rows its statistics count, the own-history rows set apart, the
    ``history`` block or None). Rows without ``history``, or of one history only, are all
    counted and there is no block; with both, the real-history rows are counted and the two
    are decomposed."""
    real = [r for r in rows if r.get("history") in (None, "real")]
    own = [r for r in rows if r.get("history") == "own"]
    if not own or not real:
        return rows, [], None
    return real, own, decompose(pair_verdicts(real, own), spec)


def decompose(pairs: Sequence[Pair], spec: IntervalSpec = IntervalSpec(),
              deep: int = DEEP) -> dict[str, Any]:
    """The summary's ``history`` block: the decomposition overall, by depth, by read/write, by
    novelty bin and for depth >= ``deep``."""
    data = _Data(pairs, spec)
    overall = data.group(lambda p: True)
    depths = sorted({p.depth for p in pairs})
    by_depth = [{"depth": d, **g} for d in depths
                if (g := data.group(lambda p, d=d: p.depth == d)) is not None]
    kinds = {"read": False, "write": True, "unknown": None}
    by_kind = {k: g for k, v in kinds.items()
               if (g := data.group(lambda p, v=v: p.write is v)) is not None}
    bins = sorted({_novelty_bin(p.novelty) for p in pairs})
    by_novelty = {b: g for b in bins
                  if (g := data.group(lambda p, b=b: _novelty_bin(p.novelty) == b)) is not None}
    deep_group = data.group(lambda p: p.depth >= deep)
    return {
        "method": ("the same ground-truth calls rehearsed given the real history (history: "
                   "real) and given the world model's own earlier rehearsed responses (history: "
                   "own); paired by step, intervals resample whole clusters "
                   "(interval.resampling_unit)"),
        "interval": spec.describe(),
        "pairs": len(pairs),
        "overall": overall,
        "compounding_share": data.compounding_share(lambda p: True),
        "deep": {"min_depth": deep, **(deep_group or {"n": 0}),
                 "compounding_share": data.compounding_share(lambda p: p.depth >= deep)},
        "by_depth": by_depth,
        "by_mutates_state": by_kind,
        "by_novelty": by_novelty,
    }


def history_line(summary: dict[str, Any]) -> str | None:
    """One line of the real-vs-own decomposition of a probe's summary, or None when the probe
    did not run both histories."""
    block = summary.get("history") or {}
    o, deep = block.get("overall"), block.get("deep") or {}
    if not o:
        return None
    share = (deep.get("compounding_share") or {}).get("point")
    return (f"history: divergence real {o['real']['point']:.1%}, own {o['own']['point']:.1%} "
            f"(own - real {o['diff']['diff']:+.1%}); induced {o['induced']['count']}, recovered "
            f"{o['recovered']['count']}; compounding share at depth >= {deep.get('min_depth')}: "
            + ("n/a" if share is None else f"{share:.0%}"))
