"""Per-turn tasks: each user turn of a BFCL task as its own task, starting after earlier turns.

Whole multi-turn tasks give a tiny model almost no reward signal. A per-turn task ``<id>@t<k>``
starts from the real state that the ground truth reaches before turn k (the environment replays
turns 0..k-1 of the ground truth on reset), shows the policy those earlier turns with their real
responses as context, and asks it to do turn k only; the verifier checks turn k.

Rollout trajectories of per-turn tasks name the *base* task in ``env`` and carry the earlier
turns as real (non-rehearsed) messages, so the audit replays them from the base task's initial
state like any other trajectory.
"""

from __future__ import annotations

from envace.core.envs.bfcl.export import real_trajectory
from envace.core.envs.bfcl.tasks import Task, load_tasks


def derive_turn_task(task: Task, k: int) -> Task:
    """Turn ``k`` of ``task`` as a task of its own."""
    if not 0 <= k < len(task.turns):
        raise ValueError(f"{task.id} has {len(task.turns)} turns; no turn {k}")
    full = real_trajectory(task).dump()["messages"]
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
    """Every turn with at least ``min_calls`` ground-truth calls, as per-turn tasks."""
    return [derive_turn_task(t, k) for t in tasks for k, gt in enumerate(t.ground_truth)
            if len(gt) >= min_calls]


def resolve(task_id: str) -> Task:
    """A task id or a per-turn id ``<id>@t<k>``."""
    if "@t" in task_id:
        base, k = task_id.rsplit("@t", 1)
        return derive_turn_task(load_tasks()[base], int(k))
    return load_tasks()[task_id]
