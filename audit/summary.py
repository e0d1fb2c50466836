"""``summary.json`` of an audit: counts that reconcile, fidelity statistics, references and skill.

Built from compact step rows (no response texts), so it can be recomputed from ``steps.jsonl``
alone (``envace-audit rescore``). Statistics are over *answered* steps; unanswered and malformed
calls are counted separately. Real (non-rehearsed) responses are summarised on their own as a
determinism check: they must never diverge.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from audit.compounding import clean, summarize, wilson_ci
from audit.reference import skill, skill_with_ci

SUMMARY_VERSION = "envace.audit/1"


def compact(rec: dict[str, Any]) -> dict[str, Any]:
    """The fields of a step record that statistics need (no texts)."""
    row = {k: rec.get(k) for k in ("trajectory_id", "task_id", "step", "tool", "diverged",
                                   "scores", "mutates_state", "novelty", "unanswered",
                                   "source_rehearsed", "actual_error", "rehearsed_error")}
    row["malformed"] = rec.get("malformed") is not None
    if rec.get("references"):
        row["ref_scores"] = {n: r["scores"] for n, r in rec["references"].items()}
    return row


def _skill_block(rows: list[dict], scorers: list[str]) -> dict[str, Any]:
    """Per scorer: each reference's mean, the best reference and the model's skill against it."""
    refs = sorted({n for r in rows for n in r.get("ref_scores", {})})
    if not refs:
        return {}
    out: dict[str, Any] = {"references": refs, "by_scorer": {}, "by_depth": {}, "by_tool": {}}
    groups = [r["trajectory_id"] for r in rows]
    for s in scorers:
        model = [r["scores"][s] for r in rows]
        means = {n: sum(r["ref_scores"][n][s] for r in rows) / len(rows) for n in refs}
        best = max(refs, key=lambda n: means[n])
        ref_vals = [r["ref_scores"][best][s] for r in rows]
        ci = skill_with_ci(model, ref_vals, groups=groups, n_boot=1000, seed=0)
        out["by_scorer"][s] = {"reference_means": means, "best_reference": best, **ci}
        for key, label in (("step", "by_depth"), ("tool", "by_tool")):
            buckets: dict[Any, list[dict]] = defaultdict(list)
            for r in rows:
                buckets[r[key]].append(r)
            table = {}
            for k, members in sorted(buckets.items(), key=lambda kv: str(kv[0])):
                fm = sum(r["scores"][s] for r in members) / len(members)
                fr = sum(r["ref_scores"][best][s] for r in members) / len(members)
                table[str(k)] = {"n": len(members), "f_model": fm, "f_ref": fr,
                                 "skill": skill(fm, fr)}
            out[label][s] = table
    return out


def _by_source(rows: list[dict]) -> dict[str, Any]:
    out = {}
    for label, flag in (("rehearsed", True), ("real", False), ("unmarked", None)):
        members = [r for r in rows if r.get("source_rehearsed") is flag]
        if members:
            k = sum(bool(r["diverged"]) for r in members)
            out[label] = {"steps": len(members), "diverged": k,
                          "divergence_rate": k / len(members),
                          "divergence_ci": list(wilson_ci(k, len(members)))}
    return out


def _error_prediction(rows: list[dict]) -> dict[str, Any]:
    """Did the world model predict the failures? (the reference penalises predicted errors)"""
    tp = sum(1 for r in rows if r["actual_error"] and r["rehearsed_error"])
    fn = sum(1 for r in rows if r["actual_error"] and not r["rehearsed_error"])
    fp = sum(1 for r in rows if not r["actual_error"] and r["rehearsed_error"])
    return {"actual_errors": tp + fn, "predicted_errors": tp + fp, "true_positive": tp,
            "recall": tp / (tp + fn) if tp + fn else None,
            "precision": tp / (tp + fp) if tp + fp else None}


def build_summary(rows: list[dict], opts: Any, *, trajectories: int, read: int,
                  skipped: list[dict], warnings: list[dict], inputs: list[str],
                  seconds: float) -> dict[str, Any]:
    """The whole ``summary.json``."""
    answered = [r for r in rows if not r["unanswered"]]
    scorers = list(opts.scorers)
    if opts.verdict_scorer not in scorers:
        scorers.append(opts.verdict_scorer)
    stats = summarize(answered, scorers)
    counts = {
        "records_read": read,
        "trajectories": trajectories,
        "skipped": len(skipped),
        "steps": len(rows),
        "answered_steps": len(answered),
        "unanswered_steps": len(rows) - len(answered),
        "malformed_calls": sum(r["malformed"] for r in rows),
        "diverged": stats["counts"]["diverged"],
    }
    return clean({
        "schema": SUMMARY_VERSION,
        "inputs": [str(p) for p in inputs],
        "scorers": scorers,
        "verdict": {"scorer": opts.verdict_scorer, "threshold": opts.verdict_threshold},
        "reference_file": opts.reference,
        "audited_model": f"reference:{opts.override}" if opts.override else None,
        "counts": counts,
        "reconciles": read == trajectories + sum(1 for s in skipped if s["line"] is not None),
        "skipped_records": skipped,
        "warnings": warnings,
        "by_source": _by_source(answered),
        "error_prediction": _error_prediction(answered),
        **{k: v for k, v in stats.items() if k != "counts"},
        "skill": _skill_block(answered, scorers),
        "seconds": seconds,
    })
