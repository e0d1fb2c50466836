"""Compounding statistics over scored steps: does one wrong rehearsal make the next ones worse?

Pure functions over a list of *step records*: dicts with at least ``trajectory_id``, ``depth``
(0-based depth among the trajectory's rehearsed calls; ``step`` is used when a record has no
``depth``), ``tool``, ``diverged`` (bool), ``scores`` (``{scorer: value}``), ``mutates_state``
(bool or None) and optionally ``novelty``. Records whose ``diverged`` is not a bool are left out of
divergence statistics. Which records to pass (rehearsed steps only) is ``audit.stats.population``'s
job.

Intervals of rates and means resample whole clusters (``audit.stats.intervals``: a seeded cluster
bootstrap; steps of one trajectory are not independent, nor are BFCL's four variants of one
scenario). A step's cluster is its ``cluster`` field (set by ``audit.stats.clusters`` from the
environment's resampling unit), else its trajectory.

- :func:`by_depth`, :func:`strata`: divergence rate and mean scores per group, with intervals.
- :func:`first_divergence_survival`: Kaplan–Meier curve of the first divergence (its
  interval a cluster bootstrap of the whole curve).
- :func:`compounding_ratio`: P(diverge | earlier divergence) / P(diverge | none earlier).
- :func:`logistic_divergence`: divergence on depth, prior divergence, write flag, novelty.
- :func:`summarize`: all of it, JSON-serialisable (no numpy scalars; NaN/inf become None).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from audit.stats.intervals import (
    BOOTSTRAP,
    IntervalSpec,
    TrajectoryResamples,
    cluster_codes,
    cluster_sums,
    mc_error,
    ratio_intervals,
)

Step = dict
_TOKEN = re.compile(r"\d+(?:\.\d+)?|[^\W\d]+")
NOVELTY_BINS = (0.0, 0.25, 0.5, 0.75, 1.0)
GREENWOOD = "greenwood"  # a survival interval that counts trajectories as independent


def clean(value: object) -> object:
    """Recursively make ``value`` JSON-safe: numpy → Python, NaN/inf → None, tuples → lists."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return [clean(v) for v in value.tolist()]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    return value


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _depth(s: Step) -> int:
    d = s.get("depth")
    return int(s["step"] if d is None else d)


def _scored(steps: Iterable[Step]) -> list[Step]:
    return [s for s in steps if isinstance(s.get("diverged"), (bool, np.bool_))]


def _scorer_names(steps: Sequence[Step], scorers: Sequence[str] | None) -> list[str]:
    if scorers is not None:
        return list(scorers)
    return sorted({name for s in steps for name in (s.get("scores") or {})})


def _cluster(s: Step) -> object:
    """A step's resampling cluster: its ``cluster`` (``audit.stats.clusters``), else its
    trajectory."""
    c = s.get("cluster")
    return s.get("trajectory_id") if c is None else c


def _score(s: Step, name: str) -> float:
    v = (s.get("scores") or {}).get(name)
    return float(v) if _finite(v) else math.nan


class _Table:
    """Scored steps as arrays, built once: trajectory code, diverged and scores per step."""

    def __init__(self, steps: Sequence[Step], scorers: Sequence[str], spec: IntervalSpec) -> None:
        self.steps, self.scorers, self.spec = steps, list(scorers), spec
        n = len(steps)
        self.codes, self.ids = cluster_codes([_cluster(s) for s in steps])
        self.traj_codes, _ = cluster_codes([s.get("trajectory_id") for s in steps])
        cols = [np.fromiter((bool(s["diverged"]) for s in steps), dtype=float, count=n)]
        cols += [np.fromiter((_score(s, m) for s in steps), dtype=float, count=n)
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
    return _Table(list(steps), scorers, spec).stats(None)


def _by_depth(table: _Table) -> list[dict]:
    return clean([{"depth": d, **v} for d, v in table.grouped(_depth).items()])


def by_depth(steps: Iterable[Step], scorers: Sequence[str] | None = None,
             spec: IntervalSpec = IntervalSpec()) -> list[dict]:
    """One row per depth: n, diverged, divergence_rate, mean of each scorer, with intervals."""
    steps = _scored(steps)
    return _by_depth(_Table(steps, _scorer_names(steps, scorers), spec))


def stratum_label(step: Step, key: str, bins: Sequence[float] = NOVELTY_BINS) -> str:
    """A step's stratum: read / write / unknown, a novelty bin `lo-hi`, or the field's value."""
    if key == "mutates_state":
        value = step.get("mutates_state")
        return "unknown" if value is None else ("write" if value else "read")
    if key == "novelty":
        value = step.get("novelty")
        if not _finite(value):
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
    steps = _scored(steps)
    return _strata(_Table(steps, _scorer_names(steps, scorers), spec), key, bins)


def _strata(table: _Table, key: str | Callable[[Step], str], bins: Sequence[float]
            ) -> dict[str, dict]:
    label = key if callable(key) else (lambda s: stratum_label(s, key, bins))
    return clean(table.grouped(label))


def _trajectories(steps: Iterable[Step]) -> dict[str, list[Step]]:
    """Steps by trajectory id (ids sorted, so bootstraps do not depend on the input order)."""
    groups: dict[str, list[Step]] = defaultdict(list)
    for s in steps:
        groups[str(s.get("trajectory_id"))].append(s)
    return {t: sorted(groups[t], key=_depth) for t in sorted(groups)}


def _km_times(steps: Iterable[Step]) -> tuple[list[tuple[int, bool]], list[object]]:
    """Per trajectory (ids sorted): (depth of its first divergence or of its last step, event),
    and its resampling cluster."""
    times: list[tuple[int, bool]] = []
    clusters: list[object] = []
    for group in _trajectories(_scored(steps)).values():
        first = next((_depth(s) for s in group if s["diverged"]), None)
        times.append((first, True) if first is not None else (_depth(group[-1]), False))
        clusters.append(_cluster(group[0]))
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


def _ratio(a: float, b: float, c: float, d: float) -> tuple[float | None, str | None]:
    """Risk ratio (a/(a+b)) / (c/(c+d)) or None with the reason."""
    if a + b == 0:
        return None, "no step follows an earlier divergence"
    if c + d == 0:
        return None, "no step at depth >= 1 lacks an earlier divergence"
    if c == 0:
        return None, "no divergence without an earlier one: the ratio is unbounded"
    return (a / (a + b)) / (c / (c + d)), None


def compounding_ratio(
    steps: Iterable[Step],
    ci_method: str = "bootstrap",
    n_boot: int = 1000,
    seed: int = 0,
    z: float = 1.96,
) -> dict:
    """P(diverge at t | an earlier divergence in the trajectory) / P(diverge at t | none earlier).

    Pooled over depths t ≥ 1. ``table`` holds the 2×2 counts. CI: ``"bootstrap"`` resamples
    whole trajectories (steps of one trajectory are not independent; seeded, percentile
    interval; an unbounded upper end is None) or ``"delta"`` (log risk ratio, treats steps as
    independent). ``ratio`` is None, with ``note`` saying why, when a cell makes it undefined.
    A ratio above 1 may be compounding or simply some trajectories being harder than others.
    """
    if ci_method not in ("bootstrap", "delta"):
        raise ValueError("ci_method must be 'bootstrap' or 'delta'")
    trajs = _trajectories(_scored(steps))
    counts = np.zeros((len(trajs), 4), dtype=np.int64)  # a, b, c, d
    per_depth: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for i, group in enumerate(trajs.values()):
        prior = False
        for s in group:
            t = _depth(s)
            if t >= 1:
                cell = (0 if s["diverged"] else 1) + (0 if prior else 2)
                counts[i, cell] += 1
                per_depth[t][cell] += 1
            prior = prior or bool(s["diverged"])
    a, b, c, d = (int(x) for x in counts.sum(axis=0))
    ratio, note = _ratio(a, b, c, d)
    ci, err = None, None
    if ratio is not None and ci_method == "delta":
        if a > 0:
            se = math.sqrt(1 / a - 1 / (a + b) + 1 / c - 1 / (c + d))
            ci = [ratio * math.exp(-z * se), ratio * math.exp(z * se)]
        else:
            note = "no divergence after an earlier one: ratio 0, delta-method CI undefined"
    elif ratio is not None and n_boot > 0:
        # resample the clusters (the trajectories of one cluster drawn together)
        codes, _ = cluster_codes([_cluster(g[0]) for g in trajs.values()])
        by_cluster = np.zeros((int(codes.max()) + 1, 4), dtype=np.int64)
        np.add.at(by_cluster, codes, counts)
        ci, boot_note, err = _bootstrap_ratio(by_cluster, n_boot, seed)
        note = boot_note
    rows = [
        {
            "depth": t,
            "prior_n": v[0] + v[1],
            "prior_diverged": v[0],
            "no_prior_n": v[2] + v[3],
            "no_prior_diverged": v[2],
            "p_after_divergence": v[0] / (v[0] + v[1]) if v[0] + v[1] else None,
            "p_no_prior_divergence": v[2] / (v[2] + v[3]) if v[2] + v[3] else None,
        }
        for t, v in sorted(per_depth.items())
    ]
    return clean(
        {
            "ratio": ratio,
            "ci": ci,
            "ci_method": ci_method,
            "ci_mc_error": err,
            "p_after_divergence": a / (a + b) if a + b else None,
            "p_no_prior_divergence": c / (c + d) if c + d else None,
            "table": {
                "prior_diverged": a,
                "prior_matched": b,
                "no_prior_diverged": c,
                "no_prior_matched": d,
            },
            "n_steps": a + b + c + d,
            "n_trajectories": len(trajs),
            "by_depth": rows,
            "note": note,
        }
    )


def _bootstrap_ratio(counts: np.ndarray, n_boot: int, seed: int
                     ) -> tuple[list | None, str | None, float | None]:
    rng = np.random.default_rng(seed)
    n = len(counts)
    batch = max(1, 2_000_000 // max(n, 1))
    ratios = []
    for start in range(0, n_boot, batch):
        idx = rng.integers(0, n, size=(min(batch, n_boot - start), n))
        sums = counts[idx].sum(axis=1).astype(float)
        a, b, c, d = sums.T
        with np.errstate(divide="ignore", invalid="ignore"):
            r = (a / (a + b)) / (c / (c + d))
        ok = (a + b > 0) & (c + d > 0) & ~((a == 0) & (c == 0))
        ratios.append(np.where(ok, r, np.nan))
    r = np.concatenate(ratios)
    r = r[~np.isnan(r)]
    dropped = n_boot - len(r)
    note = f"{dropped} of {n_boot} bootstrap replicates undefined, dropped" if dropped else None
    if len(r) == 0:
        return None, "every bootstrap replicate undefined", None
    lo, hi = np.quantile(r, [0.025, 0.975], method="inverted_cdf")
    err = mc_error(r, 0.95) if np.isfinite(r).all() else None
    return [float(lo), float(hi) if np.isfinite(hi) else None], note, err


def novelty(actual: str, history_text: str) -> float:
    """Share of the actual response's tokens that never occur in the visible history.

    Tokens: lower-cased numbers (``12``, ``3.5``) and runs of letters/underscores
    (``file_name``), counted with multiplicity. A response without tokens has novelty 0.
    """
    tokens = _TOKEN.findall(actual.lower())
    if not tokens:
        return 0.0
    seen = set(_TOKEN.findall(history_text.lower()))
    return sum(1 for t in tokens if t not in seen) / len(tokens)


def _design(steps: list[Step]) -> tuple[np.ndarray, np.ndarray, list[str], list[str], np.ndarray]:
    """Feature matrix, labels, feature names, notes, cluster index per row (the resampling
    unit's cluster of its trajectory)."""
    rows, notes, groups = [], [], []
    trajs = _trajectories(steps)
    cluster_index, _ = cluster_codes([_cluster(g[0]) for g in trajs.values()])
    for gi, group in zip(cluster_index.tolist(), trajs.values(), strict=True):
        prior = 0
        for s in group:
            rows.append(
                (
                    _depth(s),
                    prior,
                    s.get("mutates_state"),
                    s.get("novelty"),
                    int(bool(s["diverged"])),
                )
            )
            groups.append(gi)
            prior = max(prior, int(bool(s["diverged"])))
    names = ["depth", "prior_divergence", "mutates_state", "novelty"]
    cols = [[r[0] for r in rows], [r[1] for r in rows]]
    keep = names[:2]
    writes = [r[2] for r in rows]
    if all(isinstance(w, (bool, np.bool_)) for w in writes):
        cols.append([int(w) for w in writes])
        keep.append("mutates_state")
    else:
        unknown = sum(not isinstance(w, (bool, np.bool_)) for w in writes)
        notes.append(f"mutates_state left out: unknown for {unknown} of {len(rows)} steps")
    nov = [r[3] for r in rows]
    if all(_finite(v) for v in nov):
        cols.append([float(v) for v in nov])
        keep.append("novelty")
    else:
        missing = sum(not _finite(v) for v in nov)
        notes.append(f"novelty left out: missing for {missing} of {len(rows)} steps")
    x = np.array(cols, dtype=float).T.reshape(len(rows), len(cols))
    y = np.array([r[4] for r in rows], dtype=int)
    constant = [i for i in range(x.shape[1]) if np.ptp(x[:, i]) == 0]
    for i in constant:
        notes.append(f"{keep[i]} left out: constant")
    live = [i for i in range(x.shape[1]) if i not in constant]
    return x[:, live], y, [keep[i] for i in live], notes, np.array(groups)


def _fit(x: np.ndarray, y: np.ndarray, c: float) -> tuple[np.ndarray, float]:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=c, max_iter=1000).fit(x, y)
    return model.coef_[0], float(model.intercept_[0])


def _logistic_divergence(
    steps: Iterable[Step], n_boot: int = 200, seed: int = 0, c: float = 100.0
) -> dict:
    """Logistic regression of ``diverged`` on depth, any prior divergence, write flag, novelty.

    Fitted with scikit-learn under a weak L2 penalty (``C=c``) that keeps coefficients finite
    when the data separate. Features unknown for some steps, or constant, are left out (see
    ``note``). ``odds_ratio_prior_divergence`` = exp(coefficient of the prior flag), with a
    percentile CI from ``n_boot`` bootstrap resamples of whole trajectories. Single-class data
    (all steps diverged or none did) yield None values and a note, never an exception.
    """
    steps = _scored(steps)
    out: dict = {
        "n": len(steps),
        "features": [],
        "coefficients": None,
        "intercept": None,
        "odds_ratio_prior_divergence": None,
        "odds_ratio_ci": None,
        "note": None,
    }
    if not steps:
        out["note"] = "no scored steps"
        return out
    x, y, names, notes, groups = _design(steps)
    out["features"] = names
    if len(set(y.tolist())) < 2:
        notes.append("cannot fit: " + ("every step diverged" if y[0] else "no step diverged"))
        out["note"] = "; ".join(notes)
        return clean(out)
    if not names:
        notes.append("cannot fit: no feature varies")
        out["note"] = "; ".join(notes)
        return clean(out)
    coef, intercept = _fit(x, y, c)
    out["coefficients"] = dict(zip(names, coef.tolist(), strict=True))
    out["intercept"] = intercept
    if "prior_divergence" in names:
        j = names.index("prior_divergence")
        out["odds_ratio_prior_divergence"] = math.exp(coef[j])
        if n_boot > 0:
            out["odds_ratio_ci"], out["odds_ratio_ci_mc_error"] = _bootstrap_or(
                x, y, groups, j, n_boot, seed, c, notes)
    out["note"] = "; ".join(notes) or None
    return clean(out)



def logistic_divergence(steps: Iterable[Step], **kwargs: object) -> dict:
    """Logistic regression of divergence (see ``_logistic_divergence`` for the arguments).

    The many small bootstrap fits run on one BLAS thread: on a busy machine, threads waiting
    for a core made them 6x slower (measured), and they gain nothing from threads.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return _logistic_divergence(steps, **kwargs)  # type: ignore[arg-type]

def _bootstrap_or(
    x: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    j: int,
    n_boot: int,
    seed: int,
    c: float,
    notes: list[str],
) -> tuple[list | None, float | None]:
    rng = np.random.default_rng(seed)
    members = [np.flatnonzero(groups == g) for g in range(int(groups.max()) + 1)]
    ors = []
    for _ in range(n_boot):
        rows = np.concatenate([members[g] for g in rng.integers(0, len(members), len(members))])
        xb, yb = x[rows], y[rows]
        if len(set(yb.tolist())) < 2 or np.ptp(xb[:, j]) == 0:
            continue
        ors.append(math.exp(min(700.0, _fit(xb, yb, c)[0][j])))
    if len(ors) < n_boot:
        notes.append(f"{n_boot - len(ors)} of {n_boot} bootstrap fits skipped (one class)")
    if not ors:
        return None, None
    return np.quantile(ors, [0.025, 0.975]).tolist(), mc_error(np.array(ors), 0.95)


#: Which figure of the ``compounding`` block (and of the ``history`` block) answers which
#: question: the summary and the report say so beside the figures.
QUESTIONS = {
    "ratio": "are later errors associated with earlier ones? (pooled risk ratio: association "
             "only; trajectories that are simply harder push it above 1)",
    "depth_trend": "do errors grow with depth? (odds ratio of divergence per depth, "
                   "cluster-robust)",
    "history.own_minus_real": "do a model's own errors cause later ones? (envace probe "
                              "--history both: the same calls given its own earlier answers "
                              "minus given the real ones; the causal measure)",
}


def _compounding(scored: list[Step], n_boot: int, seed: int, z: float) -> dict:
    """The ``compounding`` block: the pooled ratio, the depth trend beside it, and which
    question each answers."""
    from audit.stats.trend import depth_trend

    block = compounding_ratio(scored, n_boot=n_boot, seed=seed)
    block["depth_trend"] = clean(depth_trend(
        [_depth(s) for s in scored], [float(bool(s["diverged"])) for s in scored],
        [_cluster(s) for s in scored], z))
    block["questions"] = dict(QUESTIONS)
    return block


def summarize(
    steps: Iterable[Step],
    scorers: Sequence[str] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    logistic_boot: int = 200,
    level: float = 0.95,
    unit: str = "trajectory",
) -> dict:
    """Everything above in one JSON-serialisable dict (see the README for its keys).

    ``n_boot`` cluster resamples (seeded) give the intervals of rates and means and of the
    compounding ratio; ``logistic_boot`` those of the logistic odds ratio. A step's cluster is
    its ``cluster`` field (``audit.stats.clusters``), else its trajectory; ``unit`` names it in
    ``interval``.
    """
    all_steps = list(steps)
    scored = _scored(all_steps)
    names = _scorer_names(scored, scorers)
    spec = IntervalSpec(resamples=n_boot, seed=seed, level=level, unit=unit)
    table = _Table(scored, names, spec)  # one set of trajectory resamples for every figure
    overall = table.stats(None)
    fd = first_divergence_survival(scored, spec=spec, resamples=table.resamples)
    return clean(
        {
            "counts": {
                "trajectories": len(_trajectories(all_steps)),
                "steps": len(all_steps),
                "scored_steps": len(scored),
                "diverged": overall["diverged"],
            },
            "divergence_rate": overall["divergence_rate"],
            "divergence_ci": overall["divergence_ci"],
            "divergence_ci_method": overall["divergence_ci_method"],
            "divergence_ci_mc_error": overall["divergence_ci_mc_error"],
            "scores": overall["scores"],
            "by_depth": _by_depth(table),
            "by_tool": _strata(table, "tool", NOVELTY_BINS),
            "by_mutates_state": _strata(table, "mutates_state", NOVELTY_BINS),
            "by_novelty": _strata(table, "novelty", NOVELTY_BINS),
            "first_divergence": fd,
            "median_first_divergence": fd["median"],
            "compounding": _compounding(scored, n_boot, seed, spec.z),
            "logistic": logistic_divergence(scored, n_boot=logistic_boot, seed=seed),
            "interval": spec.describe(),
        }
    )
