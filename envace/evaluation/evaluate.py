"""Evaluation in the real environment: task success (the task's own check), per backend, pass@k.

    summary = evaluate(model, tokenizer, tasks, out_dir, EvalSettings(seeds=2))

Each task is attempted once per seed with the real environment answering the policy's calls
(mode ``real``, the task's environment: BFCL or AgentDojo); the committed calls are then checked
(``envace.core.rewards``: BFCL's state check, AgentDojo's task checker). Writes
``trajectories.jsonl`` (with reward and success in each record) and ``summary.json`` (success
rate with a Wilson interval, resampling tasks when there are several seeds; per backend (for
AgentDojo: per suite), pass@k over seeds, end reasons, tokens).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit.stats.intervals import cluster_ratio, wilson_ci
from audit.store.output import write_json_atomic
from envace.core.envs.bfcl.tasks import Task
from envace.core.envs.limits import DEFAULT_CALL_TIMEOUT_S, DEFAULT_MEMORY_MB
from envace.core.envs.task_envs import env_tasks
from envace.core.errors import UsageError
from envace.core.infile import read_small_bytes
from envace.core.layout import RUN
from envace.core.rewards import task_reward
from envace.core.schema import TrajectoryWriter
from envace.model.rollout import ACT, REHEARSE, RolloutConfig, run_episodes
from envace.model.windows import fitting_tasks


@dataclass
class EvalSettings:
    seeds: int = 1
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 128
    max_turns: int = 8
    max_context: int = 4096
    batch_size: int = 16
    reward: str = "state"
    mode: str = "real"
    desc_chars: int = 60
    memory: Any = None  # rehearse with a memory of real responses (RolloutConfig.memory)
    memory_k: int = 3
    # every real environment call's limits (RolloutConfig.call_timeout_s / call_memory_mb)
    call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S
    call_memory_mb: int | None = DEFAULT_MEMORY_MB


#: what an evaluation folder holds; anything else there is another tool's, never written over
EVAL_FILES = frozenset({RUN.eval_trajectories, RUN.eval_summary, RUN.plans, RUN.audit})


def check_eval_out(out: Path) -> None:
    """UsageError unless ``out`` is new, empty or an earlier evaluation's folder (re-run: its
    files are replaced): an audit's, a run's or any other tool's folder is refused before
    anything is written (tester E17: an audit's trajectories.jsonl was truncated)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UsageError(f"--out {out} exists and is not a folder")
    if not out.is_dir():
        return
    foreign = sorted(p.name for p in out.iterdir() if p.name not in EVAL_FILES)
    summary = out / RUN.eval_summary
    if not foreign and summary.exists():
        try:
            data = json.loads(read_small_bytes(summary, 64 << 20, "--out's summary.json"))
        except (UsageError, ValueError, RecursionError):
            data = None
        if not isinstance(data, dict) or "success_rate" not in data:
            foreign = [RUN.eval_summary]
    if foreign:
        raise UsageError(f"--out {out} holds files that are not an evaluation's "
                         f"({', '.join(foreign[:5])}): choose a new folder")


def pass_at_k(successes: list[list[bool]], k: int) -> float:
    """Unbiased pass@k (Chen et al.) averaged over tasks, each with n >= k attempts."""
    from math import comb

    vals = []
    for s in successes:
        n, c = len(s), sum(s)
        vals.append(1.0 if n - c < k else 1 - comb(n - c, k) / comb(n, k))
    return sum(vals) / len(vals) if vals else 0.0


def success_interval(per_task: dict[str, list[bool]]) -> tuple[list[float | None], str]:
    """95 % interval of the success rate over all attempts and its method: Wilson's when each
    task was attempted once; with several attempts per task (seeds), which are not independent,
    a bootstrap that resamples tasks (``audit.stats.intervals``)."""
    attempts = [x for v in per_task.values() for x in v]
    if all(len(v) <= 1 for v in per_task.values()):
        return list(wilson_ci(sum(attempts), len(attempts))), "wilson"
    r = cluster_ratio([float(x) for x in attempts], [t for t, v in per_task.items() for _ in v])
    return r["ci"], f"task_bootstrap ({r['method']})"


def evaluate(model: Any, tokenizer: Any, tasks: list[Task], out_dir: Path,
             s: EvalSettings, label: str = "eval", rollout: Any | None = None) -> dict[str, Any]:
    """Evaluate; ``rollout``: run_episodes' signature on another backend (default: HF)."""
    rollout = rollout or run_episodes
    check_eval_out(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    per_task: dict[str, list[bool]] = defaultdict(list)
    rewards, ends, tokens = [], Counter(), Counter()
    by_backend: dict[str, list[bool]] = defaultdict(list)
    with TrajectoryWriter(out_dir / RUN.eval_trajectories, mode="w") as w:
        for seed in range(s.seeds):
            cfg = RolloutConfig(mode=s.mode, temperature=s.temperature, top_p=s.top_p,
                                max_new_tokens=s.max_new_tokens, max_turns=s.max_turns,
                                max_context=s.max_context, desc_chars=s.desc_chars,
                                seed=10_000 + seed, memory=s.memory, memory_k=s.memory_k,
                                call_timeout_s=s.call_timeout_s,
                                call_memory_mb=s.call_memory_mb)
            for i in range(0, len(tasks), s.batch_size):
                for ep in rollout(model, tokenizer, tasks[i:i + s.batch_size], cfg):
                    r = task_reward(s.reward, ep.task, ep.calls_per_turn, ep.final_text)
                    ep.trajectory.reward = r["reward"]
                    ep.trajectory.id = f"{ep.task.id}-s{seed}"
                    ep.trajectory.meta.update(seed=seed, success=r["success"], plan="commit",
                                              verifier=r["detail"], split=label)
                    w.write(ep.trajectory)
                    per_task[ep.task.id].append(r["success"])
                    by_backend[ep.task.primary_backend].append(r["success"])
                    rewards.append(r["reward"])
                    ends[ep.end_reason.split(":")[0]] += 1
                    tokens["act"] += ep.tokens(ACT)
                    tokens["rehearse"] += ep.tokens(REHEARSE)
    attempts = [x for v in per_task.values() for x in v]
    k = sum(attempts)
    success_ci, ci_method = success_interval(per_task)
    summary = {
        "label": label, "mode": s.mode, "tasks": len(tasks), "seeds": s.seeds,
        "attempts": len(attempts), "successes": k,
        "success_rate": k / len(attempts) if attempts else None,
        "success_ci": success_ci, "success_ci_method": ci_method,
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "pass_at_k": {str(j): pass_at_k(list(per_task.values()), j)
                      for j in range(1, s.seeds + 1)},
        "by_backend": {b: {"attempts": len(v), "success_rate": sum(v) / len(v)}
                       for b, v in sorted(by_backend.items())},
        "end_reasons": dict(ends), "tokens": dict(tokens),
        "seconds": time.perf_counter() - t0,
        "settings": {**s.__dict__, "memory": getattr(s.memory, "source", None)},
    }
    write_json_atomic(out_dir / RUN.eval_summary, summary)
    return summary


def select_tasks(split: str, unit: str, limit: int, tokenizer, max_context: int,
                 max_new_tokens: int, seed: int, env: str = "bfcl") -> list:
    """The tasks of ``env``'s split that fit the context, at most ``limit`` (seeded sample)."""
    tasks = fitting_tasks(env_tasks(env, split, unit), tokenizer, max_context, max_new_tokens)
    if limit and len(tasks) > limit:
        tasks = random.Random(seed).sample(tasks, limit)
    return tasks
