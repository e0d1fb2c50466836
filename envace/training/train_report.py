"""The end of a training run: evaluation on dev in the real environment, an audit of the
policy's rehearsals on dev, and ``report.md`` for a person. The tasks are those of the run's
environment (``env``), so on AgentDojo the evaluation runs AgentDojo's checkers and the audit
replays against AgentDojo.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from envace.core.envs.task_envs import env_tasks
from envace.core.layout import RUN
from envace.core.timing import shares
from envace.evaluation.evaluate import EvalSettings, evaluate
from envace.model.windows import fitting_tasks
from envace.training.config import TrainConfig
from envace.training.train_setup import training_pool


def eval_tasks(cfg: TrainConfig, tokenizer: Any) -> list:
    """The tasks of ``eval_split`` in the run's environment (or the training pool itself)."""
    if cfg.train_tasks and cfg.eval_split == cfg.split:  # the training pool itself

        pool = training_pool(cfg, tokenizer)
        return pool[:cfg.eval_tasks] if cfg.eval_tasks else pool
    tasks = env_tasks(cfg.env, cfg.eval_split, cfg.task_unit)
    tasks = fitting_tasks(tasks, tokenizer, cfg.max_context_tokens, cfg.max_new_tokens,
                          cfg.desc_chars)
    if cfg.eval_tasks and len(tasks) > cfg.eval_tasks:
        tasks = random.Random(cfg.seed).sample(tasks, cfg.eval_tasks)
    return tasks


def finish_run(cfg: TrainConfig, policy: Any, run_dir: Path, progress: bool = True) -> None:
    tasks = eval_tasks(cfg, policy.tokenizer)
    base = dict(seeds=cfg.eval_seeds, temperature=cfg.eval_temperature, top_p=cfg.eval_top_p,
                max_new_tokens=cfg.max_new_tokens, max_turns=cfg.max_turns,
                max_context=cfg.max_context_tokens, reward=cfg.reward, desc_chars=cfg.desc_chars)
    if progress:
        print(f"[train] evaluating on {len(tasks)} {cfg.eval_split} tasks (real environment, "
              "then rehearsed)", flush=True)
    t0 = time.perf_counter()
    real = evaluate(policy.model, policy.tokenizer, tasks, RUN.eval_dir(run_dir, cfg.eval_split),
                    EvalSettings(mode="real", **base), label=cfg.eval_split,
                    rollout=policy.rollout)
    reh_dir = RUN.eval_dir(run_dir, f"{cfg.eval_split}_rehearsed")
    reh = evaluate(policy.model, policy.tokenizer, tasks, reh_dir,
                   EvalSettings(mode="rehearse", **base, memory=policy.memory,
                                memory_k=cfg.memory_k), label=f"{cfg.eval_split}_rehearsed",
                   rollout=policy.rollout)
    audit = run_audit([str(reh_dir / RUN.eval_trajectories)], reh_dir / RUN.audit,
                      AuditOptions(scorers=list(cfg.audit_scorers),
                                   verdict_scorer=cfg.verdict_scorer, progress=False))
    write_report(cfg, run_dir, real, reh, audit, eval_seconds=time.perf_counter() - t0)
    (run_dir / RUN.running).unlink(missing_ok=True)
    if progress:
        print(f"[train] done: {run_dir}\n[train] report: {run_dir / RUN.report}\n"
              f"[train] dashboard: envace-dashboard {run_dir.parent}", flush=True)


def _unit(cfg: TrainConfig) -> str:
    """What a task is: AgentDojo's and τ²'s tasks are single-turn, whatever ``task_unit``
    says (only BFCL's have several user turns)."""
    return cfg.task_unit if cfg.env == "bfcl" else "task"


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not (run_dir / RUN.metrics).exists():  # steps=0: the starting point evaluated alone
        return out
    for line in (run_dir / RUN.metrics).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _f(x: Any, pct: bool = False) -> str:
    if x is None:
        return "–"
    return f"{x:.1%}" if pct else (f"{x:.3f}" if isinstance(x, float) else str(x))


def time_line(rows: list[dict[str, Any]], eval_seconds: float | None = None) -> str:
    """The report's line on where the steps' time went: mean seconds per step and each
    section's share of all steps' time (``time/*`` of metrics.jsonl), largest first."""
    mean, share = shares(rows)
    n = sum("time/step" in r for r in rows)
    tail = "" if eval_seconds is None else f"; final evaluation {eval_seconds:.1f} s"
    if not n:
        return f"- time: no timed steps{tail}"
    parts = ", ".join(f"{k} {v:.0%}" for k, v in sorted(share.items(), key=lambda kv: -kv[1])
                      if v >= 0.005)
    return f"- time: {mean:.1f} s per step (mean of {n}): {parts}{tail}"


def write_report(cfg: TrainConfig, run_dir: Path, real: dict, reh: dict, audit: dict,
                 eval_seconds: float | None = None) -> None:
    rows = _metrics(run_dir)
    first, last = (rows[0], rows[-1]) if rows else ({}, {})
    ci = real.get("success_ci") or [None, None]
    mine = (audit.get("by_source") or {}).get("rehearsed") or {}
    hist = (audit.get("by_source") or {}).get("real") or {}
    lines = [
        f"# Run {run_dir.name}", "",
        f"- model: `{cfg.model}`, mode `{cfg.mode}`, reward `{cfg.reward}`, "
        f"tasks: {_unit(cfg)}s of `{cfg.split}` ({cfg.env}), {cfg.steps} steps of "
        f"{cfg.prompts_per_step} × {cfg.group_size}", f"- written {time.strftime('%F %T')}", "",
        "## Training (first → last step)", "", "| metric | first | last |", "|---|---|---|"]
    for k in ("reward/mean", "success/mean", "loss", "clip_frac", "entropy",
              "fidelity/divergence_rate", "fidelity/exact", "tokens/act", "tokens/rehearse"):
        lines.append(f"| {k} | {_f(first.get(k))} | {_f(last.get(k))} |")
    if "fidelity_bpb_end" in last:  # fidelity_nll_every: before the first update, after the last
        lines.append(f"| fidelity_bpb (held-out, before / after training) | "
                     f"{_f(first.get('fidelity_bpb'))} | {_f(last.get('fidelity_bpb_end'))} |")
    lines += ["", time_line(rows, eval_seconds)]
    lines += ["", f"## Evaluation on {cfg.eval_split} ({real['attempts']} attempts)", "",
              f"- real environment: success {_f(real['success_rate'], True)} "
              f"[{_f(ci[0], True)}, {_f(ci[1], True)}], mean reward {_f(real['reward_mean'])}",
              f"- rehearsed (the policy answers itself): verifier success "
              f"{_f(reh['success_rate'], True)}",
              f"- rehearsal fidelity on {cfg.eval_split}: divergence "
              f"{_f(mine.get('divergence_rate'), True)} over {mine.get('steps', 0)} rehearsed "
              f"calls (eval/{cfg.eval_split}_rehearsed/audit/report.md; the real history "
              f"of per-turn tasks replays with {_f(hist.get('divergence_rate'), True)} divergence)",
              f"- end reasons (real): {real['end_reasons']}", "",
              "Per-step audits: `audit/step_<N>/`; rollouts: `rollouts/step_<N>.jsonl`."]
    tmp = run_dir / f"{RUN.report}.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(run_dir / RUN.report)
