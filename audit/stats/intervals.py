"""Confidence intervals that respect trajectories: a seeded cluster (trajectory) bootstrap.

Steps of one trajectory are not independent: a world model that gets one response of a task wrong
tends to get the next ones wrong too, so an interval that treats steps as independent draws is too
narrow wherever a trajectory has several steps. Every statistic here is a ratio of per-trajectory
sums, ``sum_i x_i / sum_i n_i`` (a rate: ``x_i`` = diverged steps of trajectory ``i``, ``n_i`` its
steps; a mean: ``x_i`` = the sum of its scores). An interval resamples whole trajectories with
replacement: the ``B`` resamples are a ``(B x C)`` matrix ``W`` of multiplicities, so every
replicate of every column is ``(W @ x) / (W @ n)``, one matrix product. With one step per
trajectory this is the ordinary (iid) bootstrap. Within a summary one set of resamples of the
audit's trajectories serves every figure (``TrajectoryResamples``): a depth's or a tool's figure
is computed in each resample from the resampled trajectories' steps in that group. Intervals
are percentile intervals, widened if need be to contain the point estimate.

Degenerate data are handled honestly. When the replicates have no spread (0 of n or n of n
diverged, a single trajectory, every score equal) a percentile interval has zero width and claims
a certainty the data do not give; the interval is then Wilson's score interval for the point
estimate with n = the number of *trajectories* (method ``wilson_trajectories``), as if each
trajectory were one observation. Differences (``ratio_difference``) fall back the same way to
Newcombe's hybrid score interval built from the two Wilson-on-trajectories intervals. A mean
outside [0, 1] without spread (every value the same negative difference, say) has no such
fallback: its interval is None (method ``no_spread``), never a rate's interval that does not
hold its own point.

    spec = IntervalSpec(resamples=1000, seed=0)
    codes, _ = cluster_codes(["t1", "t1", "t2"])
    sums, counts = cluster_sums(codes, np.array([[1.0], [1.0], [0.0]]))
    ratio_intervals(sums, counts, spec)[0]   # {"point": 0.667, "ci": [...], "method": ...}
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

BOOTSTRAP = "trajectory_bootstrap"
WILSON_TRAJECTORIES = "wilson_trajectories"
NEWCOMBE_TRAJECTORIES = "newcombe_wilson_trajectories"
NO_SPREAD = "no_spread"  # replicates without spread for a mean outside [0, 1]: no interval
SIGN_FLIP = "exact_cluster_sign_flip"  # exact McNemar when every cluster is one pair
BOOTSTRAP_P = "bootstrap"
NEWCOMBE_P = "newcombe_inverted"  # the p-value of the Newcombe interval's own test
MC_ERROR = ("each bootstrap interval's mc_error: the larger Monte-Carlo standard error of its "
            "two percentile endpoints, half the distance between the order statistics of "
            "ranks B*q -/+ sqrt(B*q*(1-q)) of the B replicates (it shrinks as 1/sqrt(B)); "
            "rerun with another seed to see it")
_BATCH_CELLS = 2_000_000  # B x C cells drawn at once (bounded memory for big audits)


def wilson_ci(k: float, n: float, z: float = 1.96) -> tuple[float | None, float | None]:
    """Wilson score interval for ``k`` successes in ``n`` trials; ``(None, None)`` if n == 0.

    ``k`` and ``n`` may be fractional (an effective sample size); the interval always contains
    ``k / n``.
    """
    if n <= 0:
        return None, None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(0.0, p * (1 - p)) / n + z * z / (4 * n * n)) / denom
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


@dataclass(frozen=True)
class IntervalSpec:
    """How intervals are computed: resamples, seed and level of the cluster bootstrap, and the
    unit it resamples (``unit``: its name, ``envace.core.envs.units``; the clusters themselves
    are the rows the caller passes)."""

    resamples: int = 1000
    seed: int = 0
    level: float = 0.95
    unit: str = "trajectory"

    @property
    def z(self) -> float:
        from scipy.special import ndtri

        return float(ndtri(0.5 + self.level / 2))

    def describe(self) -> dict[str, Any]:
        """The ``interval`` block of ``summary.json``."""
        return {
            "method": BOOTSTRAP,
            "resamples": self.resamples,
            "seed": self.seed,
            "level": self.level,
            "resampling_unit": self.unit,
            "kind": f"percentile, resampling whole clusters (unit: {self.unit}) with "
                    "replacement, every trajectory and step of a drawn cluster kept",
            "monte_carlo_error": MC_ERROR,
            "fallback": f"{WILSON_TRAJECTORIES}: when the replicates have no spread (0 or all "
                        "diverged, one trajectory, equal scores), Wilson's interval with n = "
                        "the number of trajectories",
            "rates": "a rate's interval is never narrower than Wilson's with the effective "
                     "sample size n / design effect (percentile bootstraps undercover rare "
                     "events: 1 of 150 would otherwise read [0, 2%])",
        }


def cluster_codes(ids: Sequence[object]) -> tuple[np.ndarray, list[str]]:
    """Integer code per step of its trajectory id (ids sorted, so row order does not matter)."""
    names, codes = np.unique(np.asarray([str(i) for i in ids], dtype=object).astype(str),
                             return_inverse=True)
    return codes.reshape(-1).astype(np.int64), [str(n) for n in names]


def cluster_sums(codes: np.ndarray, values: np.ndarray, n_clusters: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster sums and counts of each column of ``values`` (``(n,)`` or ``(n, m)``).

    Non-finite values (a scorer that did not score a step) count in neither.
    """
    v = np.asarray(values, dtype=float)
    if v.ndim == 1:
        v = v[:, None]
    c = int(n_clusters if n_clusters is not None else (codes.max() + 1 if len(codes) else 0))
    ok = np.isfinite(v)
    sums = np.zeros((c, v.shape[1]))
    counts = np.zeros((c, v.shape[1]))
    for j in range(v.shape[1]):
        sums[:, j] = np.bincount(codes, weights=np.where(ok[:, j], v[:, j], 0.0), minlength=c)
        counts[:, j] = np.bincount(codes, weights=ok[:, j].astype(float), minlength=c)
    return sums, counts


def resample_weights(n_clusters: int, resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Batches of ``(b x C)`` multiplicity matrices (uint16): each row one resample of C clusters.

    Seeded: the same arguments give the same matrices, batch by batch.
    """
    rng = np.random.default_rng(seed)
    batch = max(1, _BATCH_CELLS // max(n_clusters, 1))
    for start in range(0, resamples, batch):
        b = min(batch, resamples - start)
        idx = rng.integers(0, n_clusters, size=(b, n_clusters), dtype=np.int32)
        flat = (idx + (np.arange(b, dtype=np.int32) * n_clusters)[:, None]).ravel()
        counts = np.bincount(flat, minlength=b * n_clusters).reshape(b, n_clusters)
        yield counts.astype(np.uint16)  # a multiplicity above 65535 has probability ~0


class TrajectoryResamples:
    """One set of B resamples of an audit's C trajectories, shared by every figure.

    A group's figure (a depth, a tool) is computed in each resample from the resampled
    trajectories' steps in that group, so all figures of a summary come from the same bootstrap
    world and the trajectories are drawn once. The weights are kept in memory (uint16) when
    ``B x C`` is at most ``cache_cells``; otherwise they are redrawn, identically, per figure.
    """

    def __init__(self, n_clusters: int, spec: IntervalSpec, cache_cells: int = 50_000_000
                 ) -> None:
        self.n_clusters, self.spec = n_clusters, spec
        self._cache: list[np.ndarray] | None = None
        if n_clusters * spec.resamples <= cache_cells:
            self._cache = list(resample_weights(n_clusters, spec.resamples, spec.seed))

    def batches(self) -> Iterator[np.ndarray]:
        if self._cache is not None:
            return iter(self._cache)
        return resample_weights(self.n_clusters, self.spec.resamples, self.spec.seed)

    def replicates(self, members: np.ndarray | None, sums: np.ndarray, counts: np.ndarray
                   ) -> np.ndarray:
        """``(B x m)`` replicates of each column's ratio for the clusters ``members`` (row ``i``
        of ``sums``/``counts`` is cluster ``members[i]``; None: all, in order). NaN where a
        resample holds none of the group's values."""
        parts = []
        for w in self.batches():
            wg = (w if members is None else w[:, members]).astype(float)
            num, den = wg @ sums, wg @ counts
            with np.errstate(divide="ignore", invalid="ignore"):
                parts.append(np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan))
        return np.concatenate(parts) if parts else np.empty((0, sums.shape[1]))


def _replicates(sums: np.ndarray, counts: np.ndarray, spec: IntervalSpec,
                seed_offset: int = 0) -> np.ndarray:
    """``(B x m)`` bootstrap replicates of each column's ratio (NaN where a resample is empty)."""
    shifted = IntervalSpec(spec.resamples, spec.seed + seed_offset, spec.level, spec.unit)
    return TrajectoryResamples(len(sums), shifted, cache_cells=0).replicates(None, sums, counts)


def _percentile(values: np.ndarray, level: float) -> tuple[float, float] | None:
    v = values[np.isfinite(values)]
    if len(v) == 0:
        return None
    a = (1 - level) / 2
    lo, hi = np.quantile(v, [a, 1 - a])
    return float(lo), float(hi)


def _column_percentiles(reps: np.ndarray, level: float) -> list[tuple[float, float] | None]:
    """Per column of replicates: the percentile interval, or None when they have no spread."""
    if not np.isnan(reps).any():  # the usual case: one vectorised call
        a = (1 - level) / 2
        qs = np.quantile(reps, [a, 1 - a], axis=0)
        spread = reps.max(axis=0) - reps.min(axis=0) if len(reps) else np.zeros(reps.shape[1])
        return [(float(qs[0, j]), float(qs[1, j])) if spread[j] > 1e-12 else None
                for j in range(reps.shape[1])]
    return [_percentile(reps[:, j], level) if _spread(reps[:, j]) > 1e-12 else None
            for j in range(reps.shape[1])]


def mc_error(values: np.ndarray, level: float) -> float | None:
    """Monte-Carlo standard error of a percentile interval's endpoints from its ``B``
    replicates (the larger of the two): half the distance between the order statistics of
    ranks ``B q -/+ sqrt(B q (1 - q))``, the binomial spread of the rank of the ``q``-quantile
    (a distribution-free estimate). None when fewer than two replicates are finite."""
    v = np.sort(np.asarray(values, dtype=float)[np.isfinite(values)])
    b = len(v)
    if b < 2:
        return None
    out = 0.0
    for q in ((1 - level) / 2, (1 + level) / 2):
        h = math.sqrt(b * q * (1 - q))
        lo = int(min(b - 1, max(0, math.floor(q * (b - 1) - h))))
        hi = int(min(b - 1, max(0, math.ceil(q * (b - 1) + h))))
        out = max(out, float(v[hi] - v[lo]) / 2)
    return out


def sign_flip_p(diffs: Sequence[float]) -> float | None:
    """Exact two-sided p-value of the cluster sign-flip (permutation) test of a paired
    difference: under H0 (A and B exchangeable within each cluster) every cluster's integer
    difference ``d_i`` (B's count minus A's) is as likely negated, so ``T = sum d_i`` has the
    distribution of ``sum e_i d_i`` over all 2^G signs, computed exactly by convolution; p =
    P(|T| >= |t|). With one pair per cluster (``d_i`` in {-1, 0, 1}) this is the exact
    McNemar test (binomial on the discordant pairs). None when a ``d_i`` is not an integer."""
    d = np.asarray(diffs, dtype=float)
    if len(d) and not np.allclose(d, np.round(d)):
        return None
    a = np.abs(np.round(d).astype(np.int64))
    a = a[a > 0]
    t = abs(int(round(float(d.sum()))))
    total = int(a.sum())
    if total == 0:
        return 1.0
    dist = np.zeros(2 * total + 1)
    dist[total] = 1.0  # index total is T = 0
    for k in a:  # every cluster: half its mass shifted up by k, half down by k
        dist = 0.5 * (np.roll(dist, int(k)) + np.roll(dist, -int(k)))
    values = np.arange(-total, total + 1)
    return float(min(1.0, dist[np.abs(values) >= t].sum()))


def _spread(values: np.ndarray) -> float:
    v = values[np.isfinite(values)]
    return float(v.max() - v.min()) if len(v) else 0.0


def effective_size(sums: np.ndarray, counts: np.ndarray) -> float:
    """Kish's effective sample size of a clustered rate, p(1 - p) / Var(p), with the
    cluster-robust variance of the ratio ``sum x_i / sum n_i``: n / design effect. One step per
    trajectory gives exactly n; repeating steps within their trajectories changes nothing.
    0 or all: the number of trajectories."""
    sums, counts = np.asarray(sums, dtype=float), np.asarray(counts, dtype=float)
    n = float(counts.sum())
    clusters = int((counts > 0).sum())
    if n <= 0:
        return 0.0
    p = float(sums.sum()) / n
    robust = float(((sums - p * counts) ** 2).sum()) / (n * n)
    if p <= 0.0 or p >= 1.0 or robust <= 0.0:
        return float(clusters)
    return p * (1 - p) / robust


def ratio_intervals(sums: np.ndarray, counts: np.ndarray, spec: IntervalSpec,
                    shared: TrajectoryResamples | None = None,
                    members: np.ndarray | None = None,
                    binary: Sequence[bool] | None = None) -> list[dict[str, Any]]:
    """Per column: ``point``, ``ci``, ``method``, ``n`` (values), ``trajectories`` (with any).

    Row ``i`` of ``sums``/``counts`` is one trajectory. ``shared``: resample through these
    shared resamples, row ``i`` being trajectory ``members[i]`` of them; otherwise the rows are
    resampled on their own (seeded by ``spec``). ``binary[j]``: column ``j`` is a rate (0/1
    values); its interval is widened to contain Wilson's with :func:`effective_size`.
    """
    sums = np.asarray(sums, dtype=float).reshape(len(sums), -1)
    counts = np.asarray(counts, dtype=float).reshape(len(counts), -1)
    reps = None
    if spec.resamples > 0 and len(sums):
        reps = (shared.replicates(members, sums, counts) if shared is not None
                else _replicates(sums, counts, spec))
    bounds = _column_percentiles(reps, spec.level) if reps is not None else None
    out = []
    for j in range(sums.shape[1]):
        n = float(counts[:, j].sum())
        clusters = int((counts[:, j] > 0).sum())
        if n <= 0:
            out.append({"point": None, "ci": None, "method": None, "n": 0, "trajectories": 0,
                        "mc_error": None})
            continue
        point = float(sums[:, j].sum() / n)
        ci, method = None, None
        if bounds is not None:
            pct = bounds[j]
            if pct is not None:
                ci, method = [min(pct[0], point), max(pct[1], point)], BOOTSTRAP
            elif 0.0 <= point <= 1.0:
                lo, hi = wilson_ci(point * clusters, clusters, spec.z)
                ci, method = [lo, hi], WILSON_TRAJECTORIES
            else:  # no spread and not a rate: Wilson's interval would mean nothing
                ci, method = None, NO_SPREAD
            if binary is not None and binary[j] and method == BOOTSTRAP:
                n_eff = effective_size(sums[:, j], counts[:, j])
                lo, hi = wilson_ci(point * n_eff, n_eff, spec.z)
                if lo is not None:
                    ci = [min(ci[0], lo), max(ci[1], hi)]
        err = (mc_error(reps[:, j], spec.level) if reps is not None and method == BOOTSTRAP
               else None)
        out.append({"point": point, "ci": ci, "method": method, "n": int(round(n)),
                    "trajectories": clusters, "mc_error": err})
    return out


def cluster_ratio(values: Sequence[float], groups: Sequence[object],
                  spec: IntervalSpec = IntervalSpec()) -> dict[str, Any]:
    """Mean of ``values`` (a rate when they are 0/1) with a trajectory-bootstrap interval.

    ``groups[i]`` is the trajectory of ``values[i]``; one group per value gives the iid
    bootstrap. Returns ``point``, ``ci``, ``method``, ``n`` and ``trajectories``.
    """
    if len(values) != len(groups):
        raise ValueError("values and groups must have the same length")
    if not len(values):
        return {"point": None, "ci": None, "method": None, "n": 0, "trajectories": 0,
                "mc_error": None}
    codes, _ = cluster_codes(groups)
    v = np.asarray(values, dtype=float)
    sums, counts = cluster_sums(codes, v)
    return ratio_intervals(sums, counts, spec, binary=[bool(np.isin(v, (0.0, 1.0)).all())])[0]


def _newcombe(pa: float, ca: int, pb: float, cb: int, z: float) -> list[float] | None:
    """Newcombe's hybrid score interval of pb - pa from Wilson intervals on trajectory counts."""
    la, ua = wilson_ci(pa * ca, ca, z)
    lb, ub = wilson_ci(pb * cb, cb, z)
    if la is None or lb is None:
        return None
    d = pb - pa
    return [d - math.sqrt((pb - lb) ** 2 + (ua - pa) ** 2),
            d + math.sqrt((ub - pb) ** 2 + (pa - la) ** 2)]


def newcombe_p(pa: float, ca: int, pb: float, cb: int) -> float | None:
    """Two-sided p-value that goes with :func:`_newcombe`'s interval: ``2 (1 - Phi(z*))`` for the
    ``z*`` at which the interval's end touches 0 (the interval widens with ``z``), so the
    interval at level ``1 - alpha`` excludes 0 exactly when ``p < alpha``. None without an
    interval; 1 when the difference is 0."""
    if _newcombe(pa, ca, pb, cb, 1.0) is None:
        return None
    if pb == pa:
        return 1.0

    def excludes(z: float) -> bool:
        lo, hi = _newcombe(pa, ca, pb, cb, z)  # type: ignore[misc]
        return lo > 0 or hi < 0

    lo_z, hi_z = 0.0, 40.0
    if excludes(hi_z):
        return math.erfc(hi_z / math.sqrt(2))
    for _ in range(60):  # bisection to ~1e-16 in z
        mid = (lo_z + hi_z) / 2
        lo_z, hi_z = (mid, hi_z) if excludes(mid) else (lo_z, mid)
    return float(math.erfc(hi_z / math.sqrt(2)))


def ratio_difference(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray],
                     spec: IntervalSpec, paired: bool) -> list[dict[str, Any]]:
    """B − A for each column of two audits' per-trajectory ``(sums, counts)``.

    ``paired``: both hold the same trajectories, row ``i`` of ``a`` and ``b`` the same one; the
    two are resampled together (one ``W``). Otherwise each audit's trajectories are resampled
    independently. Per column: ``a``, ``b``, ``diff``, ``ci`` (percentile), ``method``,
    ``mc_error`` (of the interval's endpoints, :func:`mc_error`), ``p_value`` (two-sided) and
    ``test``, how it was made: ``exact_cluster_sign_flip`` (:func:`sign_flip_p`) when the design
    is paired and both sides count the same steps of every cluster with integer sums (a rate on
    the same calls: the exact McNemar test, clustered); otherwise ``bootstrap``, from the share
    of replicates on either side of 0 (never below ``1 / (B + 1)``); or, where the interval is
    Newcombe's (a side with one cluster, or replicates without spread) and no exact test
    applies, ``newcombe_inverted`` (:func:`newcombe_p`: the p-value of that interval's own
    test, so the two agree).
    """
    (sa, na), (sb, nb) = a, b
    if paired and sa.shape[0] != sb.shape[0]:
        raise ValueError("paired audits need the same trajectories in the same order")
    if paired and spec.resamples > 0 and len(sa):
        shared = TrajectoryResamples(len(sa), spec, cache_cells=0)
        reps = shared.replicates(None, sb, nb) - shared.replicates(None, sa, na)
    elif spec.resamples > 0 and len(sa) and len(sb):
        reps = _replicates(sb, nb, spec, 1) - _replicates(sa, na, spec, 0)
    else:
        reps = None
    ra, rb = ratio_intervals(sa, na, IntervalSpec(0)), ratio_intervals(sb, nb, IntervalSpec(0))
    out = []
    for j in range(sa.shape[1]):
        pa, pb = ra[j]["point"], rb[j]["point"]
        row: dict[str, Any] = {"a": pa, "b": pb, "diff": None, "ci": None, "p_value": None,
                               "method": None, "test": None, "mc_error": None}
        if pa is None or pb is None:
            out.append(row)
            continue
        row["diff"] = d = pb - pa
        # a side with one cluster has no between-cluster spread to resample: the bootstrap
        # would hold it fixed (an interval and a p-value far too sure); both then come from
        # Newcombe's interval on cluster counts, the p-value by inverting that interval, so
        # the two always agree (p < alpha exactly when the interval excludes 0)
        ca, cb = ra[j]["trajectories"], rb[j]["trajectories"]
        if reps is not None:
            col = reps[:, j][np.isfinite(reps[:, j])]
            if len(col) and _spread(col) > 1e-12 and min(ca, cb) >= 2:
                lo, hi = _percentile(col, spec.level)  # type: ignore[misc]
                row["ci"], row["method"] = [min(lo, d), max(hi, d)], BOOTSTRAP
                row["mc_error"] = mc_error(col, spec.level)
                below, above = int((col <= 0).sum()), int((col >= 0).sum())
                row["p_value"] = min(1.0, 2 * (1 + min(below, above)) / (len(col) + 1))
                row["test"] = BOOTSTRAP_P
            else:
                row["ci"] = _newcombe(pa, ca, pb, cb, spec.z)
                row["method"] = NEWCOMBE_TRAJECTORIES
                row["p_value"] = newcombe_p(pa, ca, pb, cb)
                row["test"] = NEWCOMBE_P if row["p_value"] is not None else None
        exact = (sign_flip_p(sb[:, j] - sa[:, j])
                 if paired and np.array_equal(na[:, j], nb[:, j]) else None)
        if exact is not None:
            row["p_value"], row["test"] = exact, SIGN_FLIP
        out.append(row)
    return out
