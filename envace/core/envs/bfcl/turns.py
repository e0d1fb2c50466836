"""Per-turn tasks: each user turn of a BFCL task as its own task, starting after earlier turns.

Whole multi-turn tasks give a tiny model almost no reward signal. A per-turn task ``<id>@t<k>``
starts from the real state that the ground truth reaches before turn k (the environment replays
turns 0..k-1 of the ground truth on reset), shows the policy those earlier turns with their real
responses as context, and asks it to do turn k only; the verifier checks turn k.

Rollout trajectories of per-turn tasks name the *base* task in ``env`` and carry the earlier
turns as real (non-rehearsed) messages, so the audit replays them from the base task's initial
state like any other trajectory.

The earlier turns' real responses come from executing the ground truth, and that execution runs
under the call limits like every other environment call (issue 39; ``envace.core.envs.guard``):
one child environment serves a whole split (:func:`turn_tasks`), and a task whose ground truth
runs past the limit is left out of the split with a line on stderr, never a stall.
"""

from __future__ import annotations

import sys
from typing import Any

from envace.core.envs.bfcl.export import real_trajectory
from envace.core.envs.bfcl.tasks import Task, load_tasks
from envace.core.envs.guard import guarded_env
from envace.core.envs.limits import CallLimits, CallTimeout, EnvProcessDied
from envace.core.envs.recording import ExportSkip
from envace.core.text import terminal_safe

#: What the ground truth's execution may cost (the defaults of every environment call).
TURN_LIMITS = CallLimits()


def ground_truth_messages(task: Task, env: Any = None) -> list[dict[str, Any]]:
    """The messages of ``task``'s real trajectory, its ground truth executed in ``env`` (default:
    a child environment of its own under :data:`TURN_LIMITS`). Raises :class:`ExportSkip` (a
    call past the limit, or too large) or :class:`CallTimeout` / :class:`EnvProcessDied`."""
    own = env is None
    env = guarded_env("bfcl", TURN_LIMITS) if own else env
    try:
        return real_trajectory(task, env).dump()["messages"]
    finally:
        if own and hasattr(env, "close"):
            env.close()


def derive_turn_task(task: Task, k: int, full: list[dict[str, Any]] | None = None) -> Task:
    """Turn ``k`` of ``task`` as a task of its own (``full``: the task's real messages, when
    already made by :func:`ground_truth_messages`)."""
    if not 0 <= k < len(task.turns):
        raise ValueError(f"{task.id} has {len(task.turns)} turns; no turn {k}")
    full = full if full is not None else ground_truth_messages(task)
    history, turn = [], 0
    for m in full:  # messages before the k-th user turn (or the k-th tools-added message)
        if m["role"] in ("user", "system") and turn == k:
            break
        if m["role"] == "assistant" and not m.get("tool_calls"):
            history.append(m)
            turn += 1
            continue
        history.append(m)
    return Task(
        id=f"{task.id}@t{k}", category=task.category, scenario=task.scenario,
        involved_classes=task.involved_classes, initial_config=task.initial_config,
        turns=[task.turns[k]], ground_truth=[task.ground_truth[k]],
        excluded_functions=task.excluded_functions
        + [n for t, names in task.missed_functions.items() if t > k for n in names],
        # a turn that restores withheld tools opens with the "new tools available" message
        missed_functions={0: list(task.missed_functions[k])} if k in task.missed_functions else {},
        base_id=task.id, history=history, prefix=task.ground_truth[:k])


def turn_tasks(tasks: list[Task], min_calls: int = 1) -> list[Task]:
    """Every turn with at least ``min_calls`` ground-truth calls, as per-turn tasks (each task's
    ground truth executed once, in one child environment under the call limits; a task whose
    ground truth cannot be executed within them is left out, named on stderr)."""
    env = guarded_env("bfcl", TURN_LIMITS)
    out: list[Task] = []
    try:
        for t in tasks:
            keep = [k for k, gt in enumerate(t.ground_truth) if len(gt) >= min_calls]
            if not keep:
                continue
            try:
                full = ground_truth_messages(t, env)
            except (ExportSkip, CallTimeout, EnvProcessDied) as exc:
                print(f"envace: task {terminal_safe(t.id)} left out: its ground truth could not "
                      f"be executed within the call limits ({terminal_safe(str(exc)[:200])})",
                      file=sys.stderr)
                continue
            out.extend(derive_turn_task(t, k, full) for k in keep)
    finally:
        if hasattr(env, "close"):
            env.close()
    return out


def resolve(task_id: str) -> Task:
    """A task id or a per-turn id ``<id>@t<k>``."""
    if "@t" in task_id:
        base, k = task_id.rsplit("@t", 1)
        return derive_turn_task(load_tasks()[base], int(k))
    return load_tasks()[task_id]
