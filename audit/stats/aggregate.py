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

import pickle
import tempfile
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from audit.stats.clusters import cluster_of, resolve
from audit.stats.compounding import QUESTIONS
from audit.stats.confidence import KEY as CONFIDENCE
from audit.stats.confidence import confidence_block
from audit.stats.intervals import (
    IntervalSpec,
    TrajectoryResamples,
    ratio_intervals,
)
from audit.stats.likelihood import NOT_SCORED, likelihood_block
from audit.stats.population import DETERMINISM, EMPTY, REHEARSED, Population, is_rehearsed
from audit.stats.running import (
    Compounding,
    Group,
    Logistic,
    Survival,
    Table,
    cluster_key,
    depth_of,
)
from audit.stats.state_change import FIELD as STATE_LEAVES
from audit.stats.state_change import StateChangeRunning
from audit.stats.steps import clean
from audit.stats.summary import LOGISTIC_BOOT, N_BOOT, SEED, _determinism_warning, build_summary
from audit.store.models import SUMMARY_VERSION
from envace.core.envs.units import BUILTIN_UNITS

__all__ = ["SummaryAggregator"]

_SOURCES = (("rehearsed", True), ("real", False), ("unmarked", None))
#: what the per-call blocks ``confidence`` and ``likelihood`` read of a row: an audit with
#: such a field keeps one slim row per call for them (they are not running aggregates: memory
#: grows by about 1 kB a call, docs/audit.md); ``by_state_change`` is a running aggregate
_SLIM = ("trajectory_id", "cluster", "depth", "step", "diverged", "scores", "mutates_state",
         "actual_error", "rehearsed_error", "unanswered", STATE_LEAVES, CONFIDENCE,
         "confidence_min", "likelihood", NOT_SCORED)


def _slim(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r[k] for k in _SLIM if k in r}


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
        table = Table(scorers, spec)
        survival, compounding = Survival(), Compounding()
        logistic = Logistic(store=len(self._verdicts.get(kind, ())) == 2)
        sources = {label: Group() for label, _ in _SOURCES}
        real_diverged: set[str] = set()
        c = Counter()
        errors = Counter()
        pop_clusters: set[str] = set()
        kept: dict[str, list[dict[str, Any]]] = {"confidence": [], "likelihood": []}
        state = StateChangeRunning(scorers, spec) if STATE_LEAVES in self._per_call else None
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
                    sources[label].add(cluster_key(r), [float(bool(r["diverged"]))],
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
            if state is not None:
                state.add(pop)
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
            group = sorted(scored, key=depth_of)
            survival.add(group)
            compounding.add(group)
            logistic.add(str(group[0].get("trajectory_id")), group)
        table.close()
        out = self._assemble(kw, chosen, spec, scorers, kind, table, survival, compounding,
                             logistic, sources, real_diverged, c, errors, pop_clusters)
        # build_summary's per-call blocks, in its order, between "skill" and "seconds"
        seconds = out.pop("seconds")
        blocks = {"by_state_change": state.result() if state is not None else None,
                  "likelihood": likelihood_block(kept["likelihood"], spec),
                  "confidence": confidence_block(kept["confidence"], spec)}
        out.update({k: v for k, v in blocks.items() if v is not None})
        out["seconds"] = seconds
        return clean(out)

    def _assemble(self, kw: dict[str, Any], chosen: Any, spec: IntervalSpec,
                  scorers: list[str], kind: str, table: Table, survival: Survival,
                  compounding: Compounding, logistic: Logistic,
                  sources: dict[str, Group], real_diverged: set[str], c: Counter,
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
    def _by_source(sources: dict[str, Group], real_diverged: set[str],
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
