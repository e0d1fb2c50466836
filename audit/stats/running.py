"""Running aggregates of the audit's statistics (``audit.stats.aggregate``): per group and
resampling cluster the sums ``build_summary`` makes, added in the same order, the
first-divergence times, the compounding table and the logistic fit's per-step design, so a
summary needs no list of all rows. Each class mirrors the function named in its docstring."""

from __future__ import annotations

import math
from array import array
from collections import Counter, defaultdict
from typing import Any

import numpy as np

from audit.stats import compounding as cp
from audit.stats import survival as sv
from audit.stats.depth_tables import stratum_label
from audit.stats.intervals import (
    BOOTSTRAP,
    IntervalSpec,
    TrajectoryResamples,
    mc_error,
    ratio_intervals,
)
from audit.stats.steps import clean, is_finite, score_of
from audit.stats.trend import METHOD as TREND_METHOD
from audit.stats.trend import depth_trend


def depth_of(s: dict[str, Any]) -> int:
    d = s.get("depth")
    return int(s["step"] if d is None else d)


def cluster_key(s: dict[str, Any]) -> str:
    c = s.get("cluster")
    return str(s.get("trajectory_id") if c is None else c)


class Group:
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


class Table:
    """``audit.stats.compounding._Table`` over running groups: the same ``stats`` dicts."""

    def __init__(self, scorers: list[str], spec: IntervalSpec, overall_only: bool = False
                 ) -> None:
        self.scorers, self.spec = scorers, spec
        #: only the ("all", None) group (a stratum's own table: ``state_change``)
        self.overall_only = overall_only
        self.groups: dict[tuple[str, Any], Group] = defaultdict(Group)
        self.ids: list[str] = []
        self.code: dict[str, int] = {}
        self.resamples: TrajectoryResamples | None = None

    def add_trajectory(self, scored: list[dict[str, Any]]) -> None:
        touched = set()
        for s in scored:
            cl = cluster_key(s)
            div = bool(s["diverged"])
            values = [float(div)] + [score_of(s, m) for m in self.scorers]
            if self.overall_only:
                self.groups["all", None].add(cl, values, div)
                touched.add(("all", None))
                continue
            for key in (("all", None), ("depth", depth_of(s)),
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
        g = self.groups.get(key) or Group()
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


class Survival:
    """Per cluster, how many trajectories first diverged (or were censored) at each depth."""

    def __init__(self) -> None:
        self.by_cluster: dict[str, Counter] = defaultdict(Counter)

    def add(self, group: list[dict[str, Any]]) -> None:
        first = next((depth_of(s) for s in group if s["diverged"]), None)
        time = (first, True) if first is not None else (depth_of(group[-1]), False)
        self.by_cluster[cluster_key(group[0])][time] += 1

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


class Compounding:
    """Per cluster the 2x2 table of later steps (after a divergence or not, diverged or not),
    per depth the same table, and the depth trend's (cluster, depth, verdict) counts."""

    def __init__(self) -> None:
        self.by_cluster: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        self.per_depth: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        self.trend: Counter = Counter()
        self.trajectories = 0

    def add(self, group: list[dict[str, Any]]) -> None:
        self.trajectories += 1
        cell_counts = self.by_cluster[cluster_key(group[0])]
        prior = False
        for s in group:
            t = depth_of(s)
            if t >= 1:
                cell = (0 if s["diverged"] else 1) + (0 if prior else 2)
                cell_counts[cell] += 1
                self.per_depth[t][cell] += 1
            prior = prior or bool(s["diverged"])

    def add_trend(self, s: dict[str, Any]) -> None:
        self.trend[(cluster_key(s), depth_of(s), float(bool(s["diverged"])))] += 1

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


class Logistic:
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
            self.cluster.append(cluster_key(group[0]))
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
            for j, x in enumerate((depth_of(s), prior, w, v)):
                if x == x:  # not NaN
                    self.lo[j], self.hi[j] = min(self.lo[j], x), max(self.hi[j], x)
            if self.store:
                self.depth.append(depth_of(s))
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
