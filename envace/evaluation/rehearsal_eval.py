"""Evaluate with test-time rehearsal: commits scored by the verifier, plans audited, budgets.

The summary says whether plans with more faithful rehearsals led to successful commits: the
per-task mean exact-match fidelity of the plans beside the commit's success (point-biserial
correlation with its p-value, and success rates above/below the median fidelity).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from audit.stats.intervals import wilson_ci
from audit.store.output import write_json_atomic
from envace.core.layout import AUDIT, RUN
from envace.core.rewards import task_reward
from envace.core.schema import TrajectoryWriter
from envace.evaluation.evaluate import check_eval_out, pass_at_k
from envace.model.rehearsal import RehearsalSettings, rehearse_and_commit


def _fidelity_by_plan(audit_dir: Path) -> dict[str, float]:
    """Mean exact match of each plan's rehearsed steps, by trajectory id."""
    import json

    per: dict[str, list[float]] = defaultdict(list)
    steps = audit_dir / AUDIT.steps
    if not steps.exists():
        return {}
    for line in steps.read_text().splitlines():
        r = json.loads(line)
        if r.get("source_rehearsed") is not False and not r.get("unanswered"):
            per[r["trajectory_id"]].append(r["scores"].get("exact", 0.0))
    return {k: sum(v) / len(v) for k, v in per.items()}


def _audit_figures(audit: dict[str, Any], path: Path) -> dict[str, Any]:
    """The plans' audit headline: rehearsed steps only, trajectory-bootstrap interval."""
    if audit.get("determinism_check"):  # no plan rehearsed anything
        return {"divergence_rate": None, "divergence_ci": None, "steps": 0, "trajectories": 0,
                "dir": str(path)}
    c = audit["counts"]
    return {"divergence_rate": audit.get("divergence_rate"),
            "divergence_ci": audit.get("divergence_ci"), "steps": c.get("scored_steps"),
            "trajectories": c.get("scored_trajectories"), "dir": str(path)}


def _relation(fid: list[float], success: list[bool]) -> dict[str, Any]:
    pairs = [(f, s) for f, s in zip(fid, success, strict=True) if not math.isnan(f)]
    out: dict[str, Any] = {"tasks_with_rehearsed_steps": len(pairs)}
    if len(pairs) < 3 or len({s for _, s in pairs}) < 2 or len({f for f, _ in pairs}) < 2:
        out["note"] = "too few tasks, or no variation in fidelity or success"
        return out
    from scipy.stats import pointbiserialr

    r = pointbiserialr([s for _, s in pairs], [f for f, _ in pairs])
    med = sorted(f for f, _ in pairs)[len(pairs) // 2]
    hi = [s for f, s in pairs if f >= med]
    lo = [s for f, s in pairs if f < med]
    out.update(point_biserial_r=float(r.statistic), p_value=float(r.pvalue),
               success_fidelity_at_or_above_median=sum(hi) / len(hi) if hi else None,
               success_fidelity_below_median=sum(lo) / len(lo) if lo else None)
    return out


def call_counts(budgets: list[dict[str, float]], trust: float | None) -> dict[str, Any]:
    """Environment calls over all attempts: the commits' real calls, the plans' calls answered
    by rehearsal and by a real environment (the oracle's copies, or the trust gate's, of which
    ``plans_gated_real``), and ``real_total`` = commits' + plans' real calls."""
    def total(key: str) -> int:
        return int(sum(b.get(key, 0) for b in budgets))

    out = {"trust_above": trust, "commit_real": total("real_env_calls"),
           "plans_rehearsed": total("rehearsed_calls"), "plans_real": total("sandbox_env_calls"),
           "plans_gated_real": total("gated_real_calls")}
    out["real_total"] = out["commit_real"] + out["plans_real"]
    return out


def evaluate_with_rehearsal(model: Any, tok: Any, tasks: list, s: RehearsalSettings, out: Path,
                            seeds: int = 1, reward: str = "state", model_name: str = ""
                            ) -> dict[str, Any]:
    check_eval_out(out)
    out.mkdir(parents=True, exist_ok=True)
    per_task: dict[str, list[bool]] = defaultdict(list)
    by_backend: dict[str, list[bool]] = defaultdict(list)
    budgets: list[dict[str, float]] = []
    plan_ids: list[list[str]] = []
    successes: list[bool] = []
    per_attempt: list[dict[str, Any]] = []
    plans_file = out / RUN.plans
    with TrajectoryWriter(out / RUN.eval_trajectories, mode="w") as w, \
            TrajectoryWriter(plans_file, mode="w") as wp:
        for seed in range(seeds):
            settings = RehearsalSettings(**{**s.__dict__, "seed": s.seed + 1000 * seed})
            for res in rehearse_and_commit(model, tok, tasks, settings):
                task, commit = res["task"], res["commit"]
                v = task_reward(reward, task, commit.calls_per_turn, commit.final_text)
                ids = []
                for k, plan in enumerate(res["plans"]):
                    t = plan.trajectory
                    t.id = f"{task.id}-s{seed}-plan{k}"
                    t.model = model_name
                    t.meta.update(plan=f"rehearsal_{k}", seed=seed, strategy=s.strategy,
                                  critique=(res["critiques"][k] if k < len(res["critiques"])
                                            else None))
                    wp.write(t)
                    w.write(t)
                    ids.append(t.id)
                c = commit.trajectory
                c.id, c.model, c.reward = f"{task.id}-s{seed}-commit", model_name, v["reward"]
                c.meta.update(plan="commit", seed=seed, strategy=s.strategy, n=s.n,
                              memory=res["memory"]["text"],
                              memory_dropped=res["memory"]["dropped"], success=v["success"],
                              budget=res["budget"], plans=ids)
                w.write(c)
                per_task[task.id].append(v["success"])
                by_backend[task.primary_backend].append(v["success"])
                budgets.append(res["budget"])
                plan_ids.append(ids)
                successes.append(v["success"])
                per_attempt.append({"task": task.id, "seed": seed, "success": v["success"],
                                    "reward": v["reward"]})
    audit = None
    fidelity: list[float] = [float("nan")] * len(successes)
    if any(plan_ids):
        audit = run_audit([str(plans_file)], out / RUN.audit,
                          AuditOptions(progress=False, plots=True))
        fid = _fidelity_by_plan(out / RUN.audit)
        for i, ids in enumerate(plan_ids):
            vals = [fid[x] for x in ids if x in fid]
            fidelity[i] = sum(vals) / len(vals) if vals else float("nan")
    k = sum(successes)
    n = len(successes)
    summary = {
        "strategy": s.strategy, "n": s.n, "tasks": len(tasks), "seeds": seeds, "attempts": n,
        "successes": k, "success_rate": k / n if n else None,
        "success_ci": list(wilson_ci(k, n)),
        "reward": reward,
        "reward_mean": sum(a["reward"] for a in per_attempt) / n if n else None,
        "pass_at_k": {str(j): pass_at_k(list(per_task.values()), j) for j in range(1, seeds + 1)},
        "per_attempt": per_attempt,
        "by_backend": {b: {"attempts": len(v), "success_rate": sum(v) / len(v)}
                       for b, v in sorted(by_backend.items())},
        "budget": {key: sum(b[key] for b in budgets) / len(budgets) for key in budgets[0]}
        if budgets else {},
        "calls": call_counts(budgets, s.trust),
        "rehearsal_audit": None if audit is None else _audit_figures(audit, out / RUN.audit),
        "fidelity_vs_success": _relation(fidelity, successes),
        "settings": {**s.__dict__, "memory": getattr(s.memory, "source", None),
                     "lookup": getattr(s.lookup, "source", None)},
    }
    write_json_atomic(out / RUN.eval_summary, summary)
    return summary
