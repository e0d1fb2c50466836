"""``summary.json`` of an audit: counts that reconcile, fidelity statistics, references and skill.

Built from compact step rows (no response texts), so it can be recomputed from ``steps.jsonl``
alone (``envace-audit rescore``). Every statistic is over the *answered rehearsed* steps, depth
counted from each trajectory's first rehearsed step (``audit.stats.population``; a file of real
responses only is a determinism check, its statistics over the real steps). Unanswered and
malformed calls are counted separately. Real (non-rehearsed) responses are summarised on their
own in ``by_source`` as a determinism check: they must never diverge, and a warning says so when
one does. Intervals resample whole clusters of the environment's resampling unit
(``audit.stats.clusters``: BFCL's scenario, the task elsewhere; ``opts.cluster_by`` overrides it),
named in ``resampling_unit``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from audit.stats.clusters import CLUSTER, assign_clusters, resolve
from audit.stats.compounding import compounding_block, logistic_divergence
from audit.stats.confidence import confidence_block
from audit.stats.depth_tables import (
    NOVELTY_BINS,
    StepTable,
    depth_rows,
    group_stats,
    stratum_label,
    table_strata,
)
from audit.stats.history import split_histories
from audit.stats.intervals import IntervalSpec
from audit.stats.likelihood import likelihood_block
from audit.stats.population import DETERMINISM, population
from audit.stats.state_change import by_state_change
from audit.stats.steps import Step, by_trajectory, clean, scored_steps, scorer_names
from audit.stats.survival import first_divergence_survival
from audit.store.models import SUMMARY_VERSION
from audit.store.step_rows import StepRow
from audit.worlds.reference import skill, skill_with_ci

N_BOOT = 1000  # cluster resamples of every interval (rates, means, ratio, skill)
LOGISTIC_BOOT = 200  # resamples of the logistic odds-ratio interval (each one a model fit)
SEED = 0


__all__ = ["SUMMARY_VERSION", "build_summary", "compact"]
_ROW_FIELDS = frozenset(StepRow.model_fields) | {"ref_scores", "cluster", "state_leaves"}


def compact(rec: dict[str, Any]) -> dict[str, Any]:
    """The fields of a step record that statistics need (no texts)."""
    row = {k: rec.get(k) for k in ("trajectory_id", "task_id", "step", "tool", "diverged",
                                   "scores", "mutates_state", "novelty", "unanswered",
                                   "source_rehearsed", "actual_error", "rehearsed_error")}
    if "depth" in rec:
        row["depth"] = rec["depth"]
    if rec.get("env_name") is not None:
        row["env_name"] = rec["env_name"]
    if rec.get("history") is not None:
        row["history"] = rec["history"]
    row["malformed"] = rec.get("malformed") is not None
    change = rec.get("state_change")
    if isinstance(change, dict) and isinstance(change.get("leaves"), int):
        row["state_leaves"] = change["leaves"]
    for k, v in rec.items():  # a writer's own scalar fields: what --cluster-by FIELD reads
        if k not in _ROW_FIELDS and isinstance(v, (str, int, float, bool)):
            row[k] = v
    if isinstance(rec.get("likelihood"), dict):
        row["likelihood"] = rec["likelihood"]
    for k in ("likelihood_skipped", "confidence", "confidence_min"):
        if rec.get(k) is not None:
            row[k] = rec[k]
    if rec.get("references"):
        row["ref_scores"] = {n: r["scores"] for n, r in rec["references"].items()}
    return row


def _cluster(r: dict[str, Any]) -> str:
    c = r.get(CLUSTER)
    return str(r["trajectory_id"] if c is None else c)


def _bucket_order(kv: tuple[Any, list]) -> tuple[bool, Any]:
    """Depths in numeric order, other labels alphabetically."""
    k = kv[0]
    return (not isinstance(k, int), k if isinstance(k, int) else str(k))


def _skill_block(rows: list[dict], scorers: list[str]) -> dict[str, Any]:
    """Per scorer: each reference's mean, the best reference and the model's skill against it
    (and against each reference, ``against``);
    by depth and tool (points), by read/write tool and by novelty (points and trajectory-bootstrap
    intervals: does a world model only win where it can copy?)."""
    refs = sorted({n for r in rows for n in r.get("ref_scores", {})})
    if not refs:
        return {}
    out: dict[str, Any] = {"references": refs, "by_scorer": {}, "by_depth": {}, "by_tool": {},
                           "by_mutates_state": {}, "by_novelty": {}}
    groups = [_cluster(r) for r in rows]
    for s in scorers:
        model = [r["scores"][s] for r in rows]
        means = {n: sum(r["ref_scores"][n][s] for r in rows) / len(rows) for n in refs}
        best = max(refs, key=lambda n: means[n])
        ref_vals = [r["ref_scores"][best][s] for r in rows]
        ci = skill_with_ci(model, ref_vals, groups=groups, n_boot=N_BOOT, seed=SEED)
        against = {}
        for n in refs:
            each = ci if n == best else skill_with_ci(
                model, [r["ref_scores"][n][s] for r in rows], groups=groups, n_boot=N_BOOT,
                seed=SEED)
            against[n] = {k: each[k] for k in ("point", "lo", "hi", "f_ref", "n_boot_used",
                                                     "method", "mc_error")}
        out["by_scorer"][s] = {"reference_means": means, "best_reference": best, **ci,
                               "against": against}
        for key, label in (("depth", "by_depth"), ("tool", "by_tool")):
            buckets: dict[Any, list[dict]] = defaultdict(list)
            for r in rows:
                buckets[r[key]].append(r)
            table = {}
            for k, members in sorted(buckets.items(), key=_bucket_order):
                fm = sum(r["scores"][s] for r in members) / len(members)
                fr = sum(r["ref_scores"][best][s] for r in members) / len(members)
                table[str(k)] = {"n": len(members), "f_model": fm, "f_ref": fr,
                                 "skill": skill(fm, fr)}
            out[label][s] = table
        for key in ("mutates_state", "novelty"):
            strata: dict[str, list[dict]] = defaultdict(list)
            for r in rows:
                strata[stratum_label(r, key)].append(r)
            out[f"by_{key}"][s] = {
                k: skill_with_ci([r["scores"][s] for r in m],
                                 [r["ref_scores"][best][s] for r in m],
                                 groups=[_cluster(r) for r in m], n_boot=N_BOOT, seed=SEED)
                for k, m in sorted(strata.items())}
    return out


def _by_source(rows: list[dict], spec: IntervalSpec) -> dict[str, Any]:
    """Divergence of each kind of response: rehearsed, real (the determinism check), unmarked."""
    out: dict[str, Any] = {}
    for label, flag in (("rehearsed", True), ("real", False), ("unmarked", None)):
        members = [r for r in rows if r.get("source_rehearsed") is flag]
        if members:
            g = group_stats(members, [], spec)
            out[label] = {"steps": g["n"], "trajectories": g["trajectories"],
                          "diverged": g["diverged"], "divergence_rate": g["divergence_rate"],
                          "divergence_ci": g["divergence_ci"],
                          "divergence_ci_method": g["divergence_ci_method"],
                          "clusters": g["clusters"],
                          "divergence_ci_mc_error": g["divergence_ci_mc_error"]}
    real = [r for r in rows if r.get("source_rehearsed") is False and r["diverged"]]
    if real:
        ids = sorted({str(r["trajectory_id"]) for r in real})
        out["real"]["diverged_trajectories"] = ids[:20]
    return out


def _determinism_warning(by_source: dict[str, Any]) -> str | None:
    real = by_source.get("real") or {}
    if not real.get("diverged"):
        return None
    return (f"{real['diverged']} of {real['steps']} real (non-rehearsed) responses diverge from "
            f"the replay (trajectories {', '.join(real.get('diverged_trajectories', []))}): the "
            "environment is not deterministic, or the recorded history is not what it returns; "
            "fidelity figures of these trajectories are suspect")


def _error_prediction(rows: list[dict]) -> dict[str, Any]:
    """Did the world model predict the failures? (the reference penalises predicted errors)"""
    tp = sum(1 for r in rows if r["actual_error"] and r["rehearsed_error"])
    fn = sum(1 for r in rows if r["actual_error"] and not r["rehearsed_error"])
    fp = sum(1 for r in rows if not r["actual_error"] and r["rehearsed_error"])
    return {"actual_errors": tp + fn, "predicted_errors": tp + fp, "true_positive": tp,
            "recall": tp / (tp + fn) if tp + fn else None,
            "precision": tp / (tp + fp) if tp + fp else None}


def summarize(
    steps: Iterable[Step],
    scorers: Sequence[str] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    logistic_boot: int = 200,
    level: float = 0.95,
    unit: str = "trajectory",
) -> dict:
    """The fidelity statistics of scored steps in one JSON-serialisable dict: counts, the
    divergence rate, scores, the tables by depth and stratum (``audit.stats.depth_tables``), the
    first-divergence curve (``audit.stats.survival``), the ``compounding`` block and the logistic
    model (``audit.stats.compounding``), and how the intervals were made.

    ``n_boot`` cluster resamples (seeded) give the intervals of rates and means and of the
    compounding ratio; ``logistic_boot`` those of the logistic odds ratio. A step's cluster is
    its ``cluster`` field (``audit.stats.clusters``), else its trajectory; ``unit`` names it in
    ``interval``.
    """
    all_steps = list(steps)
    scored = scored_steps(all_steps)
    names = scorer_names(scored, scorers)
    spec = IntervalSpec(resamples=n_boot, seed=seed, level=level, unit=unit)
    table = StepTable(scored, names, spec)  # one set of trajectory resamples for every figure
    overall = table.stats(None)
    fd = first_divergence_survival(scored, spec=spec, resamples=table.resamples)
    return clean(
        {
            "counts": {
                "trajectories": len(by_trajectory(all_steps)),
                "steps": len(all_steps),
                "scored_steps": len(scored),
                "diverged": overall["diverged"],
            },
            "divergence_rate": overall["divergence_rate"],
            "divergence_ci": overall["divergence_ci"],
            "divergence_ci_method": overall["divergence_ci_method"],
            "divergence_ci_mc_error": overall["divergence_ci_mc_error"],
            "scores": overall["scores"],
            "by_depth": depth_rows(table),
            "by_tool": table_strata(table, "tool", NOVELTY_BINS),
            "by_mutates_state": table_strata(table, "mutates_state", NOVELTY_BINS),
            "by_novelty": table_strata(table, "novelty", NOVELTY_BINS),
            "first_divergence": fd,
            "median_first_divergence": fd["median"],
            "compounding": compounding_block(scored, n_boot, seed, spec.z),
            "logistic": logistic_divergence(scored, n_boot=logistic_boot, seed=seed),
            "interval": spec.describe(),
        }
    )


def build_summary(rows: list[dict], opts: Any, *, trajectories: int, read: int,
                  skipped: list[dict], warnings: list[dict], inputs: list[str],
                  seconds: float, logistic_boot: int | None = None) -> dict[str, Any]:
    """The whole ``summary.json`` (``logistic_boot``: resamples of the odds-ratio interval,
    default ``LOGISTIC_BOOT``).

    A probe run with both histories (``history`` "real" and "own" on its rows) has its
    statistics over the real-history (teacher-forced) rows and the decomposition of the two in
    a ``history`` block (``audit.stats.history``); the own-history rows are counted apart."""
    chosen = resolve(rows, getattr(opts, "cluster_by", None))
    unit = chosen.unit
    missing_field = assign_clusters(rows, unit, chosen.cluster_of)
    spec = IntervalSpec(resamples=N_BOOT, seed=SEED, unit=unit)
    rows, own_rows, history_block = split_histories(rows, spec)
    answered = [r for r in rows if not r["unanswered"]]
    scorers = list(opts.scorers)
    if opts.verdict_scorer not in scorers:
        scorers.append(opts.verdict_scorer)
    pop = population(answered)
    stats = summarize(pop.rows, scorers, n_boot=N_BOOT, seed=SEED,
                      logistic_boot=LOGISTIC_BOOT if logistic_boot is None else logistic_boot,
                      unit=unit)
    stats["interval"]["clusters"] = len({_cluster(r) for r in pop.rows})
    stats["interval"]["unit_declared_by"] = chosen.source
    if chosen.note:
        stats["interval"]["unit_note"] = chosen.note
    if missing_field:
        stats["interval"]["rows_without_field"] = missing_field
    counts = {
        "records_read": read,
        "trajectories": trajectories,
        "skipped": len(skipped),
        "steps": len(rows),
        "answered_steps": len(answered),
        "unanswered_steps": len(rows) - len(answered),
        "malformed_calls": sum(r["malformed"] for r in rows),
        "scored_steps": len(pop.rows),
        "scored_trajectories": stats["counts"]["trajectories"],
        "rehearsed_steps": pop.counts["rehearsed_steps"],
        "unmarked_steps": pop.counts["unmarked_steps_counted_as_rehearsed"],
        "real_steps": sum(r.get("source_rehearsed") is False for r in answered),
        "diverged": stats["counts"]["diverged"],
        "scored_clusters": stats["interval"]["clusters"],
    }
    if own_rows:
        counts["own_history_steps"] = len(own_rows)
    by_source = _by_source(answered, spec)
    likelihood = likelihood_block(rows, spec)
    confidence = confidence_block(pop.rows, spec)
    skill_block = _skill_block(pop.rows, scorers)
    best = {s: b["best_reference"] for s, b in (skill_block.get("by_scorer") or {}).items()}
    state_block = by_state_change(pop.rows, scorers, spec, best)
    return clean({
        "schema": SUMMARY_VERSION,
        "inputs": [str(p) for p in inputs],
        "scorers": scorers,
        "verdict": {"scorer": opts.verdict_scorer, "threshold": opts.verdict_threshold},
        "reference_file": opts.reference,
        "audited_model": f"reference:{opts.override}" if opts.override else None,
        "counts": counts,
        "resampling_unit": unit,
        **({"resampling_unit_note": chosen.note} if chosen.note else {}),
        "reconciles": read == trajectories + sum(1 for s in skipped if s["line"] is not None),
        "skipped_records": skipped,
        "warnings": warnings,
        "statistics": pop.describe(),
        "determinism_check": pop.kind == DETERMINISM,
        "determinism_warning": _determinism_warning(by_source),
        "by_source": by_source,
        "error_prediction": _error_prediction(pop.rows),
        **{k: v for k, v in stats.items() if k != "counts"},
        "skill": skill_block,
        **({"by_state_change": state_block} if state_block is not None else {}),
        **({"history": history_block} if history_block is not None else {}),
        **({"likelihood": likelihood} if likelihood is not None else {}),
        **({"confidence": confidence} if confidence is not None else {}),
        "seconds": seconds,
    })
