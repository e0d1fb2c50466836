"""``summary.json`` of an audit from running aggregates: flat memory at any number of steps.

    agg = SummaryAggregator(opts)
    for rows in per_trajectory_rows:          # compact rows (``compact``), one trajectory at a time
        agg.add(rows)
    summary = agg.summary(trajectories=..., read=..., skipped=..., warnings=..., inputs=...,
                          seconds=...)        # == build_summary(all rows, opts, ...)

The figures are :func:`audit.stats.summary.build_summary`'s over the same rows, value for value
(tests/audit/test_aggregate.py), but no list of all rows is kept. Rows are spilled to a
temporary file as they come (a pickle per trajectory) while the few things that decide how the
statistics are taken are gathered (which unit the intervals resample, which steps count); a
second pass over the spill then keeps, per group (overall, depth, tool, read/write, novelty bin,
source) and resampling cluster, running sums in the order ``build_summary`` adds them (so every
float is the same), per cluster the first-divergence times and the compounding table, and per
step only what the two logistic fits need (depth, prior divergence, write flag, novelty,
verdict: about 15 bytes). Audits this path does not cover (a probe's two histories, reference
world models' scores, stored rows without depth) are summarised by ``build_summary`` from the
spill, exactly as before.

This module mirrors the statistics of ``audit.stats.compounding``, ``audit.stats.population``,
``audit.stats.trend`` and ``audit.stats.summary``: a change there must be made here too (the
equality test fails until it is).
"""

from __future__ import annotations

import math
import pickle
import tempfile
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np

from audit.stats import compounding as cp
from audit.stats import survival as sv
from audit.stats.clusters import cluster_of, resolve
from audit.stats.compounding import QUESTIONS
from audit.stats.confidence import KEY as CONFIDENCE
from audit.stats.confidence import confidence_block
from audit.stats.depth_tables import stratum_label
from audit.stats.intervals import (
    BOOTSTRAP,
    IntervalSpec,
    TrajectoryResamples,
    mc_error,
    ratio_intervals,
)
from audit.stats.likelihood import NOT_SCORED, likelihood_block
from audit.stats.population import DETERMINISM, EMPTY, REHEARSED, Population, is_rehearsed
from audit.stats.state_change import FIELD as STATE_LEAVES
from audit.stats.state_change import by_state_change
from audit.stats.steps import clean, is_finite, score_of
from audit.stats.summary import LOGISTIC_BOOT, N_BOOT, SEED, _determinism_warning, build_summary
from audit.stats.trend import METHOD as TREND_METHOD
from audit.stats.trend import depth_trend
from audit.store.models import SUMMARY_VERSION
from envace.core.envs.units import BUILTIN_UNITS

__all__ = ["SummaryAggregator"]

_SOURCES = (("rehearsed", True), ("real", False), ("unmarked", None))
#: what the per-call blocks (``by_state_change``, ``confidence``, ``likelihood``) read of a row:
#: an audit with such a field keeps one slim row per call for them (they are not running
#: aggregates: memory grows by about 1 kB a call, docs/audit.md)
_SLIM = ("trajectory_id", "cluster", "depth", "step", "diverged", "scores", "mutates_state",
         "actual_error", "rehearsed_error", "unanswered", STATE_LEAVES, CONFIDENCE,
         "confidence_min", "likelihood", NOT_SCORED)


def _slim(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r[k] for k in _SLIM if k in r}


def _depth(s: dict[str, Any]) -> int:
    d = s.get("depth")
    return int(s["step"] if d is None else d)


def _cluster(s: dict[str, Any]) -> str:
    c = s.get("cluster")
    return str(s.get("trajectory_id") if c is None else c)


class _Group:
    """One group's running figures: steps, diverged, trajectories, and per cluster the sums
    and finite counts of each column, added in row order (``cluster_sums``'s order)."""

    __slots__ = ("clusters", "k", "n", "trajectories")

    def __init__(self) -> None:
        self.n = self.k = self.trajectories = 0
        self.clusters: dict[str, tuple[list[float], list[float]]] = {}

    def add(self, cluster: str, values: list[float], diverged: bool) -> None:
        self.n += 1
        self.k += diverged
        cell = self.clusters.get(cluster)
        if cell is None:
            cell = self.clusters[cluster] = ([0.0] * len(values), [0.0] * len(values))
        sums, counts = cell
        for j, v in enumerate(values):
            if math.isfinite(v):
                sums[j] += v
                counts[j] += 1.0
            else:
                sums[j] += 0.0


class _Table:
    """``audit.stats.compounding._Table`` over running groups: the same ``stats`` dicts."""

    def __init__(self, scorers: list[str], spec: IntervalSpec) -> None:
        self.scorers, self.spec = scorers, spec
        self.groups: dict[tuple[str, Any], _Group] = defaultdict(_Group)
        self.ids: list[str] = []
        self.code: dict[str, int] = {}
        self.resamples: TrajectoryResamples | None = None

    def add_trajectory(self, scored: list[dict[str, Any]]) -> None:
        touched = set()
        for s in scored:
            cl = _cluster(s)
            div = bool(s["diverged"])
            values = [float(div)] + [score_of(s, m) for m in self.scorers]
            for key in (("all", None), ("depth", _depth(s)),
                        ("tool", stratum_label(s, "tool")),
                        ("mutates_state", stratum_label(s, "mutates_state")),
                        ("novelty", stratum_label(s, "novelty"))):
                self.groups[key].add(cl, values, div)
                touched.add(key)
        for key in touched:
            self.groups[key].trajectories += 1

    def close(self) -> None:
        every = self.groups.get(("all", None))
        self.ids = sorted(every.clusters) if every is not None else []
        self.code = {c: i for i, c in enumerate(self.ids)}
        n = every.n if every is not None else 0
        self.resamples = (TrajectoryResamples(len(self.ids), self.spec)
                          if n and self.spec.resamples > 0 else None)

    def stats(self, key: tuple[str, Any]) -> dict[str, Any]:
        g = self.groups.get(key) or _Group()
        out: dict = {"n": g.n, "trajectories": 0, "diverged": g.k, "divergence_rate": None,
                     "divergence_ci": None, "divergence_ci_method": None,
                     "scores": {name: {"mean": None, "ci": None, "n": 0, "method": None}
                                for name in self.scorers},
                     "clusters": 0, "divergence_ci_mc_error": None}
        if not g.n:
            return out
        names = sorted(g.clusters, key=self.code.__getitem__)
        uniq = np.array([self.code[c] for c in names], dtype=np.int64)
        sums = np.array([g.clusters[c][0] for c in names], dtype=float)
        counts = np.array([g.clusters[c][1] for c in names], dtype=float)
        res = ratio_intervals(sums, counts, self.spec, self.resamples,
                              None if len(uniq) == len(self.ids) else uniq,
                              binary=[True] + [False] * len(self.scorers))
        out.update(trajectories=g.trajectories, divergence_rate=g.k / g.n,
                   divergence_ci=res[0]["ci"], divergence_ci_method=res[0]["method"],
                   clusters=len(uniq), divergence_ci_mc_error=res[0]["mc_error"])
        for name, r in zip(self.scorers, res[1:], strict=True):
            out["scores"][name] = {"mean": r["point"], "ci": r["ci"], "n": r["n"],
                                   "method": r["method"], "mc_error": r["mc_error"]}
        return out

    def grouped(self, kind: str) -> dict[Any, dict[str, Any]]:
        keys = sorted(k for (t, k) in self.groups if t == kind)
        return {k: self.stats((kind, k)) for k in keys}


class _Survival:
    """Per cluster, how many trajectories first diverged (or were censored) at each depth."""

    def __init__(self) -> None:
        self.by_cluster: dict[str, Counter] = defaultdict(Counter)

    def add(self, group: list[dict[str, Any]]) -> None:
        first = next((_depth(s) for s in group if s["diverged"]), None)
        time = (first, True) if first is not None else (_depth(group[-1]), False)
        self.by_cluster[_cluster(group[0])][time] += 1

    def result(self, spec: IntervalSpec, resamples: TrajectoryResamples | None,
               z: float = 1.96) -> dict[str, Any]:
        """``compounding.first_divergence_survival``'s dict."""
        total: Counter = Counter()
        for c in self.by_cluster.values():
            total.update(c)
        depths = max((u for u, _ in total), default=-1) + 1
        reps = (self._bootstrap(depths, spec, resamples)
                if depths and spec.resamples > 0 else np.empty((0, depths)))
        a = (1 - spec.level) / 2
        rows, surv, greenwood, median = [], 1.0, 0.0, None
        for t in range(depths):
            at_risk = sum(k for (u, _), k in total.items() if u >= t)
            if at_risk == 0:
                break
            events = sum(k for (u, e), k in total.items() if u == t and e)
            censored = sum(k for (u, e), k in total.items() if u == t and not e)
            surv *= 1 - events / at_risk
            greenwood += (events / (at_risk * (at_risk - events)) if at_risk > events
                          else math.inf)
            gw = sv._greenwood_ci(surv, greenwood, z)
            col = reps[:, t] if len(reps) else reps[:, :0].ravel()
            if len(col) and float(col.max() - col.min()) > 1e-12:
                lo, hi = np.quantile(col, [a, 1 - a])
                ci: list[float] = [min(float(lo), surv), max(float(hi), surv)]
                method, err = BOOTSTRAP, mc_error(col, spec.level)
            else:
                ci, method, err = gw, sv.GREENWOOD, None
            if median is None and surv <= 0.5:
                median = t
            rows.append({"depth": t, "at_risk": at_risk, "events": events,
                         "censored": censored, "hazard": events / at_risk, "survival": surv,
                         "ci": ci, "ci_method": method, "ci_mc_error": err,
                         "greenwood_ci": gw})
        n = sum(total.values())
        n_events = sum(k for (_, e), k in total.items() if e)
        return clean({
            "rows": rows, "median": median, "n_trajectories": n, "n_events": n_events,
            "n_censored": n - n_events, "clusters": len(self.by_cluster),
            "resampling_unit": spec.unit,
            "ci_kind": f"percentile interval of a bootstrap of the whole curve resampling "
                       f"clusters (unit: {spec.unit}; {spec.resamples} resamples, seed "
                       f"{spec.seed}); greenwood_ci treats trajectories as independent",
        })

    def _bootstrap(self, depths: int, spec: IntervalSpec,
                   resamples: TrajectoryResamples | None) -> np.ndarray:
        ids = sorted(self.by_cluster)
        at_risk = np.zeros((len(ids), depths))
        events = np.zeros((len(ids), depths))
        for c, name in enumerate(ids):
            for (u, e), k in self.by_cluster[name].items():
                at_risk[c, : u + 1] += k
                if e:
                    events[c, u] += k
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


class _Compounding:
    """Per cluster the 2x2 table of later steps (after a divergence or not, diverged or not),
    per depth the same table, and the depth trend's (cluster, depth, verdict) counts."""

    def __init__(self) -> None:
        self.by_cluster: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        self.per_depth: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        self.trend: Counter = Counter()
        self.trajectories = 0

    def add(self, group: list[dict[str, Any]]) -> None:
        self.trajectories += 1
        cell_counts = self.by_cluster[_cluster(group[0])]
        prior = False
        for s in group:
            t = _depth(s)
            if t >= 1:
                cell = (0 if s["diverged"] else 1) + (0 if prior else 2)
                cell_counts[cell] += 1
                self.per_depth[t][cell] += 1
            prior = prior or bool(s["diverged"])

    def add_trend(self, s: dict[str, Any]) -> None:
        self.trend[(_cluster(s), _depth(s), float(bool(s["diverged"])))] += 1

    def ratio(self, n_boot: int, seed: int) -> dict[str, Any]:
        """``compounding.compounding_ratio``'s dict (bootstrap interval)."""
        a, b, c, d = (sum(v[i] for v in self.by_cluster.values()) for i in range(4))
        ratio, note = cp._ratio(a, b, c, d)
        ci, err = None, None
        if ratio is not None and n_boot > 0:
            ids = sorted(self.by_cluster)
            by_cluster = np.array([self.by_cluster[k] for k in ids], dtype=np.int64)
            ci, note, err = cp._bootstrap_ratio(by_cluster, n_boot, seed)
        rows = [{"depth": t, "prior_n": v[0] + v[1], "prior_diverged": v[0],
                 "no_prior_n": v[2] + v[3], "no_prior_diverged": v[2],
                 "p_after_divergence": v[0] / (v[0] + v[1]) if v[0] + v[1] else None,
                 "p_no_prior_divergence": v[2] / (v[2] + v[3]) if v[2] + v[3] else None}
                for t, v in sorted(self.per_depth.items())]
        return clean({
            "ratio": ratio, "ci": ci, "ci_method": "bootstrap", "ci_mc_error": err,
            "p_after_divergence": a / (a + b) if a + b else None,
            "p_no_prior_divergence": c / (c + d) if c + d else None,
            "table": {"prior_diverged": a, "prior_matched": b, "no_prior_diverged": c,
                      "no_prior_matched": d},
            "n_steps": a + b + c + d, "n_trajectories": self.trajectories, "by_depth": rows,
            "note": note,
        })

    def depth_trend(self, z: float) -> dict[str, Any]:
        """``trend.depth_trend`` of every scored step (the steps are rebuilt, in its canonical
        order, only when there is something to fit)."""
        n = sum(self.trend.values())
        out: dict[str, Any] = {"odds_ratio_per_depth": None, "ci": None, "log_odds_ratio": None,
                               "se": None, "n": n,
                               "clusters": len({c for c, _, _ in self.trend}),
                               "method": TREND_METHOD, "note": None}
        if n == 0:
            out["note"] = "no scored steps"
            return out
        ys = {y for _, _, y in self.trend}
        if len(ys) == 1:
            out["note"] = "cannot fit: " + ("every step diverged" if ys.pop() else
                                            "no step diverged")
            return out
        if len({d for _, d, _ in self.trend}) == 1:
            out["note"] = "cannot fit: every step at one depth"
            return out
        keys = sorted(self.trend)
        depths = np.repeat([float(d) for _, d, _ in keys], [self.trend[k] for k in keys])
        ys_ = np.repeat([y for _, _, y in keys], [self.trend[k] for k in keys])
        clusters = np.repeat(np.array([c for c, _, _ in keys], dtype=object),
                             [self.trend[k] for k in keys])
        return depth_trend(depths, ys_, list(clusters), z)


class _Logistic:
    """Per step what ``compounding.logistic_divergence`` fits (about 15 bytes), per trajectory
    its id, first row and cluster; the design is rebuilt in its order at the end."""

    def __init__(self, store: bool = True) -> None:
        #: keep the design (only when the fit will run: both verdicts occur); otherwise only
        #: what says which features would be left out and why
        self.store = store
        self.n = self.unknown = self.missing = 0
        self.lo = [math.inf] * 4
        self.hi = [-math.inf] * 4
        self.first_y: int | None = None
        self.depth = array("q")
        self.prior = array("b")
        self.write = array("b")  # 1, 0, or -1: unknown
        self.novelty = array("d")  # NaN: missing or not finite
        self.y = array("b")
        self.ids: list[str] = []
        self.starts = array("q")
        self.cluster: list[str] = []

    def add(self, tid: str, group: list[dict[str, Any]]) -> None:
        if self.store:
            self.ids.append(tid)
            self.starts.append(len(self.y))
            self.cluster.append(_cluster(group[0]))
        elif self.first_y is None or tid < self.first_tid:
            self.first_tid, self.first_y = tid, int(bool(group[0]["diverged"]))
        prior = 0
        for s in group:
            w = s.get("mutates_state")
            w = int(w) if isinstance(w, bool | np.bool_) else -1
            v = s.get("novelty")
            v = float(v) if is_finite(v) else math.nan
            div = int(bool(s["diverged"]))
            self.n += 1
            self.unknown += w < 0
            self.missing += not math.isfinite(v)
            for j, x in enumerate((_depth(s), prior, w, v)):
                if x == x:  # not NaN
                    self.lo[j], self.hi[j] = min(self.lo[j], x), max(self.hi[j], x)
            if self.store:
                self.depth.append(_depth(s))
                self.prior.append(prior)
                self.write.append(w)
                self.novelty.append(v)
                self.y.append(div)
            prior = max(prior, div)

    def _one_class(self, out: dict[str, Any]) -> dict[str, Any]:
        n, notes = self.n, []
        keep, cols = ["depth", "prior_divergence"], [0, 1]
        if not self.unknown:
            keep.append("mutates_state")
            cols.append(2)
        else:
            notes.append(f"mutates_state left out: unknown for {self.unknown} of {n} steps")
        if not self.missing:
            keep.append("novelty")
            cols.append(3)
        else:
            notes.append(f"novelty left out: missing for {self.missing} of {n} steps")
        constant = [i for i, j in enumerate(cols) if self.lo[j] == self.hi[j]]
        notes += [f"{keep[i]} left out: constant" for i in constant]
        out["features"] = [k for i, k in enumerate(keep) if i not in constant]
        notes.append("cannot fit: " + ("every step diverged" if self.first_y else
                                       "no step diverged"))
        out["note"] = "; ".join(notes)
        return clean(out)

    def result(self, n_boot: int, seed: int, c: float = 100.0) -> dict[str, Any]:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1):
            return self._result(n_boot, seed, c)

    def _result(self, n_boot: int, seed: int, c: float) -> dict[str, Any]:
        n = self.n
        out: dict = {"n": n, "features": [], "coefficients": None, "intercept": None,
                     "odds_ratio_prior_divergence": None, "odds_ratio_ci": None, "note": None}
        if not n:
            out["note"] = "no scored steps"
            return out
        if not self.store:  # one verdict only: the notes, without the design
            return self._one_class(out)
        order = sorted(range(len(self.ids)), key=self.ids.__getitem__)
        ends = [*self.starts[1:], n]
        idx = np.concatenate([np.arange(self.starts[i], ends[i]) for i in order])
        codes = {name: i for i, name in enumerate(sorted(set(self.cluster)))}
        groups = np.concatenate([np.full(ends[i] - self.starts[i], codes[self.cluster[i]],
                                         dtype=np.int64) for i in order])
        names = ["depth", "prior_divergence", "mutates_state", "novelty"]
        cols = [np.asarray(self.depth)[idx], np.asarray(self.prior)[idx]]
        keep = names[:2]
        notes: list[str] = []
        write = np.asarray(self.write)[idx]
        unknown = int((write < 0).sum())
        if not unknown:
            cols.append(write)
            keep.append("mutates_state")
        else:
            notes.append(f"mutates_state left out: unknown for {unknown} of {n} steps")
        nov = np.asarray(self.novelty)[idx]
        missing = int((~np.isfinite(nov)).sum())
        if not missing:
            cols.append(nov)
            keep.append("novelty")
        else:
            notes.append(f"novelty left out: missing for {missing} of {n} steps")
        x = np.array(cols, dtype=float).T.reshape(n, len(cols))
        y = np.asarray(self.y, dtype=int)[idx]
        constant = [i for i in range(x.shape[1]) if np.ptp(x[:, i]) == 0]
        for i in constant:
            notes.append(f"{keep[i]} left out: constant")
        live = [i for i in range(x.shape[1]) if i not in constant]
        x, feats = x[:, live], [keep[i] for i in live]
        out["features"] = feats
        if len(set(y.tolist())) < 2:
            notes.append("cannot fit: " + ("every step diverged" if y[0] else
                                           "no step diverged"))
            out["note"] = "; ".join(notes)
            return clean(out)
        if not feats:
            notes.append("cannot fit: no feature varies")
            out["note"] = "; ".join(notes)
            return clean(out)
        coef, intercept = cp._fit(x, y, c)
        out["coefficients"] = dict(zip(feats, coef.tolist(), strict=True))
        out["intercept"] = intercept
        if "prior_divergence" in feats:
            j = feats.index("prior_divergence")
            out["odds_ratio_prior_divergence"] = math.exp(coef[j])
            if n_boot > 0:
                out["odds_ratio_ci"], out["odds_ratio_ci_mc_error"] = cp._bootstrap_or(
                    x, y, groups, j, n_boot, seed, c, notes)
        out["note"] = "; ".join(notes) or None
        return clean(out)


class SummaryAggregator:
    """Rows in, one trajectory at a time; :meth:`summary` gives ``build_summary``'s dict."""

    def __init__(self, opts: Any) -> None:
        self.opts = opts
        self._spill = tempfile.TemporaryFile(prefix="envace-audit-rows-")  # noqa: SIM115
        self._task_ids: set[str] = set()
        self._env_names: set[str] = set()
        self._has_field = False
        self._fallback = False
        #: which per-call blocks the audit has (pass 2 keeps a slim row per call for them)
        self._per_call: set[str] = set()
        self._answered = Counter()  # source_rehearsed flag -> answered steps
        #: the verdicts among scored steps, per candidate population (rehearsed / all answered)
        self._verdicts: dict[str, set[bool]] = {REHEARSED: set(), DETERMINISM: set()}

    # ------------------------------------------------------------------ pass 1
    def add(self, rows: list[dict[str, Any]]) -> None:
        """One trajectory's compact rows, in call order."""
        if not rows:
            return
        pickle.dump(rows, self._spill, protocol=pickle.HIGHEST_PROTOCOL)
        field = self.opts.cluster_by
        for r in rows:
            self._task_ids.add(str(r.get("task_id")))
            if r.get("env_name") is not None:
                self._env_names.add(str(r["env_name"]))
            if field and r.get(field) is not None:
                self._has_field = True
            if r.get("history") == "own" or r.get("ref_scores") or "depth" not in r:
                self._fallback = True
            self._per_call.update(k for k in (STATE_LEAVES, CONFIDENCE, "likelihood",
                                              NOT_SCORED) if k in r)
            if not r.get("unanswered"):
                if isinstance(r.get("diverged"), bool | np.bool_):
                    self._verdicts[DETERMINISM].add(bool(r["diverged"]))
                    if is_rehearsed(r):
                        self._verdicts[REHEARSED].add(bool(r["diverged"]))
                flag = r.get("source_rehearsed")
                self._answered["marked" if flag is True else "real" if flag is False
                               else "unmarked" if flag is None else "other"] += 1

    def _rows(self) -> Iterator[list[dict[str, Any]]]:
        self._spill.flush()
        self._spill.seek(0)
        while True:
            try:
                yield pickle.load(self._spill)
            except EOFError:
                return

    def close(self) -> None:
        self._spill.close()

    # ------------------------------------------------------------------ pass 2
    def summary(self, *, trajectories: int, read: int, skipped: list[dict],
                warnings: list[dict], inputs: list[str], seconds: float) -> dict[str, Any]:
        """The whole ``summary.json`` (:func:`audit.stats.summary.build_summary`'s)."""
        kw = {"trajectories": trajectories, "read": read, "skipped": skipped,
              "warnings": warnings, "inputs": inputs, "seconds": seconds}
        try:
            if self._fallback:
                return build_summary([r for rows in self._rows() for r in rows], self.opts, **kw)
            return self._summary(**kw)
        finally:
            self.close()

    def _resolved(self) -> Any:
        t0 = next(iter(self._task_ids), "None")
        probe = [{"task_id": t} for t in self._task_ids]
        probe += [{"env_name": n, "task_id": t0} for n in self._env_names]
        if self._has_field:
            probe.append({"task_id": t0, self.opts.cluster_by: True})
        return resolve(probe, self.opts.cluster_by)

    def _summary(self, **kw: Any) -> dict[str, Any]:
        opts = self.opts
        chosen = self._resolved()
        unit = chosen.unit
        spec = IntervalSpec(resamples=N_BOOT, seed=SEED, unit=unit)
        scorers = list(opts.scorers)
        if opts.verdict_scorer not in scorers:
            scorers.append(opts.verdict_scorer)
        rehearsed = self._answered["marked"] + self._answered["unmarked"]
        kind = REHEARSED if rehearsed else DETERMINISM if self._answered["real"] else EMPTY
        table = _Table(scorers, spec)
        survival, compounding = _Survival(), _Compounding()
        logistic = _Logistic(store=len(self._verdicts.get(kind, ())) == 2)
        sources = {label: _Group() for label, _ in _SOURCES}
        real_diverged: set[str] = set()
        c = Counter()
        errors = Counter()
        pop_clusters: set[str] = set()
        kept: dict[str, list[dict[str, Any]]] = {"state": [], "confidence": [], "likelihood": []}
        for rows in self._rows():
            for r in rows:
                r["cluster"] = cluster_of(r, unit, chosen.cluster_of)
                if unit not in BUILTIN_UNITS and chosen.cluster_of is None \
                        and r.get(unit) is None:
                    c["missing_field"] += 1
            c["steps"] += len(rows)
            answered = [r for r in rows if not r["unanswered"]]
            c["answered"] += len(answered)
            c["malformed"] += sum(r["malformed"] for r in rows)
            for label, flag in _SOURCES:
                members = [r for r in answered if r.get("source_rehearsed") is flag]
                for r in members:
                    sources[label].add(_cluster(r), [float(bool(r["diverged"]))],
                                       bool(r["diverged"]))
                if members:
                    sources[label].trajectories += 1
            for r in answered:
                if r.get("source_rehearsed") is False and r["diverged"]:
                    real_diverged.add(str(r["trajectory_id"]))
            if len(real_diverged) > 1000:
                real_diverged = set(sorted(real_diverged)[:20])
            if kind == REHEARSED:
                pop = [r for r in answered if is_rehearsed(r)]
            elif kind == DETERMINISM:
                pop = answered
                for d, r in enumerate(sorted(pop, key=lambda r: int(r.get("step") or 0))):
                    r["depth"] = d
            else:
                pop = []
            if self._per_call & {"likelihood", NOT_SCORED}:
                kept["likelihood"] += [_slim(r) for r in rows]
            if not pop:
                continue
            if STATE_LEAVES in self._per_call:
                kept["state"] += [_slim(r) for r in pop]
            if CONFIDENCE in self._per_call:
                kept["confidence"] += [_slim(r) for r in pop]
            c["pop"] += len(pop)
            c["pop_trajectories"] += 1
            for r in pop:
                errors["tp"] += bool(r["actual_error"] and r["rehearsed_error"])
                errors["fn"] += bool(r["actual_error"] and not r["rehearsed_error"])
                errors["fp"] += bool(not r["actual_error"] and r["rehearsed_error"])
                pop_clusters.add(str(r["trajectory_id"] if r.get("cluster") is None
                                     else r["cluster"]))
            scored = [s for s in pop if isinstance(s.get("diverged"), bool | np.bool_)]
            c["scored"] += len(scored)
            if not scored:
                continue
            table.add_trajectory(scored)
            for s in scored:
                compounding.add_trend(s)
            group = sorted(scored, key=_depth)
            survival.add(group)
            compounding.add(group)
            logistic.add(str(group[0].get("trajectory_id")), group)
        table.close()
        out = self._assemble(kw, chosen, spec, scorers, kind, table, survival, compounding,
                             logistic, sources, real_diverged, c, errors, pop_clusters)
        # build_summary's per-call blocks, in its order, between "skill" and "seconds"
        seconds = out.pop("seconds")
        blocks = {"by_state_change": by_state_change(kept["state"], scorers, spec, {}),
                  "likelihood": likelihood_block(kept["likelihood"], spec),
                  "confidence": confidence_block(kept["confidence"], spec)}
        out.update({k: v for k, v in blocks.items() if v is not None})
        out["seconds"] = seconds
        return clean(out)

    def _assemble(self, kw: dict[str, Any], chosen: Any, spec: IntervalSpec,
                  scorers: list[str], kind: str, table: _Table, survival: _Survival,
                  compounding: _Compounding, logistic: _Logistic,
                  sources: dict[str, _Group], real_diverged: set[str], c: Counter,
                  errors: Counter, pop_clusters: set[str]) -> dict[str, Any]:
        opts, unit = self.opts, chosen.unit
        overall = table.stats(("all", None))
        fd = survival.result(spec, table.resamples)
        block = compounding.ratio(N_BOOT, SEED)
        block["depth_trend"] = clean(compounding.depth_trend(spec.z))
        block["questions"] = dict(QUESTIONS)
        stats = clean({
            "counts": {"trajectories": c["pop_trajectories"], "steps": c["pop"],
                       "scored_steps": c["scored"], "diverged": overall["diverged"]},
            "divergence_rate": overall["divergence_rate"],
            "divergence_ci": overall["divergence_ci"],
            "divergence_ci_method": overall["divergence_ci_method"],
            "divergence_ci_mc_error": overall["divergence_ci_mc_error"],
            "scores": overall["scores"],
            "by_depth": clean([{"depth": d, **v} for d, v in table.grouped("depth").items()]),
            "by_tool": clean(table.grouped("tool")),
            "by_mutates_state": clean(table.grouped("mutates_state")),
            "by_novelty": clean(table.grouped("novelty")),
            "first_divergence": fd,
            "median_first_divergence": fd["median"],
            "compounding": block,
            "logistic": logistic.result(LOGISTIC_BOOT, SEED),
            "interval": spec.describe(),
        })
        stats["interval"]["clusters"] = len(pop_clusters)
        stats["interval"]["unit_declared_by"] = chosen.source
        if chosen.note:
            stats["interval"]["unit_note"] = chosen.note
        if c["missing_field"]:
            stats["interval"]["rows_without_field"] = c["missing_field"]
        pop = Population([], kind, {
            "rehearsed_steps": self._answered["marked"],
            "unmarked_steps_counted_as_rehearsed": self._answered["unmarked"],
            "real_steps_excluded": 0 if kind == DETERMINISM else self._answered["real"]})
        described = {**pop.describe(), "steps": c["pop"], "trajectories": c["pop_trajectories"]}
        counts = {
            "records_read": kw["read"],
            "trajectories": kw["trajectories"],
            "skipped": len(kw["skipped"]),
            "steps": c["steps"],
            "answered_steps": c["answered"],
            "unanswered_steps": c["steps"] - c["answered"],
            "malformed_calls": c["malformed"],
            "scored_steps": c["pop"],
            "scored_trajectories": stats["counts"]["trajectories"],
            "rehearsed_steps": self._answered["marked"],
            "unmarked_steps": self._answered["unmarked"],
            "real_steps": self._answered["real"],
            "diverged": stats["counts"]["diverged"],
            "scored_clusters": stats["interval"]["clusters"],
        }
        by_source = self._by_source(sources, real_diverged, spec)
        tp, fn, fp = errors["tp"], errors["fn"], errors["fp"]
        return clean({
            "schema": SUMMARY_VERSION,
            "inputs": [str(p) for p in kw["inputs"]],
            "scorers": scorers,
            "verdict": {"scorer": opts.verdict_scorer, "threshold": opts.verdict_threshold},
            "reference_file": opts.reference,
            "audited_model": f"reference:{opts.override}" if opts.override else None,
            "counts": counts,
            "resampling_unit": unit,
            **({"resampling_unit_note": chosen.note} if chosen.note else {}),
            "reconciles": kw["read"] == kw["trajectories"] + sum(
                1 for s in kw["skipped"] if s["line"] is not None),
            "skipped_records": kw["skipped"],
            "warnings": kw["warnings"],
            "statistics": described,
            "determinism_check": kind == DETERMINISM,
            "determinism_warning": _determinism_warning(by_source),
            "by_source": by_source,
            "error_prediction": {
                "actual_errors": tp + fn, "predicted_errors": tp + fp, "true_positive": tp,
                "recall": tp / (tp + fn) if tp + fn else None,
                "precision": tp / (tp + fp) if tp + fp else None},
            **{k: v for k, v in stats.items() if k != "counts"},
            "skill": {},
            "seconds": kw["seconds"],
        })

    @staticmethod
    def _by_source(sources: dict[str, _Group], real_diverged: set[str],
                   spec: IntervalSpec) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label, _ in _SOURCES:
            g = sources[label]
            if not g.n:
                continue
            ids = sorted(g.clusters)
            sums = np.array([g.clusters[k][0] for k in ids], dtype=float)
            counts = np.array([g.clusters[k][1] for k in ids], dtype=float)
            shared = TrajectoryResamples(len(ids), spec) if spec.resamples > 0 else None
            res = ratio_intervals(sums, counts, spec, shared, None, binary=[True])[0]
            out[label] = {"steps": g.n, "trajectories": g.trajectories, "diverged": g.k,
                          "divergence_rate": g.k / g.n, "divergence_ci": res["ci"],
                          "divergence_ci_method": res["method"], "clusters": len(ids),
                          "divergence_ci_mc_error": res["mc_error"]}
        if real_diverged and "real" in out:
            out["real"]["diverged_trajectories"] = sorted(real_diverged)[:20]
        return out
