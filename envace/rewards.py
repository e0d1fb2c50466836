"""Task rewards from a verifier that never feeds the policy (computed after the episode).

- ``state``: BFCL's state check of the committed calls against the ground truth (1 or 0);
- ``turn_state``: the share of checked turns passed before the first failure (partial credit);
- ``action``: F1 between the committed calls and the ground-truth calls (name + arguments,
  as multisets), a denser signal for small models.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from envace.envs.bfcl import BFCLEnv
from envace.envs.tasks import Task
from envace.envs.verify import check_calls, ground_truth_calls

REWARDS = ("state", "turn_state", "action")
Call = tuple[str, dict[str, Any]]


def _key(call: Call) -> str:
    return call[0] + json.dumps(call[1], sort_keys=True, default=str)


def action_f1(model: list[Call], truth: list[Call]) -> float:
    """F1 of two call multisets; 1.0 when both are empty."""
    if not model and not truth:
        return 1.0
    a, b = Counter(map(_key, model)), Counter(map(_key, truth))
    hit = sum((a & b).values())
    if not hit:
        return 0.0
    p, r = hit / sum(a.values()), hit / sum(b.values())
    return 2 * p * r / (p + r)


def task_reward(kind: str, task: Task, calls_per_turn: list[list[Call]]) -> dict[str, Any]:
    """{'reward': float, 'success': bool, 'detail': str}; errors become reward 0 with a reason."""
    if kind not in REWARDS:
        raise ValueError(f"reward must be one of {REWARDS}, got {kind!r}")
    try:
        check = check_calls(task, calls_per_turn)
        if kind == "action":
            env = BFCLEnv()
            env.reset(task)
            truth = [c for turn in ground_truth_calls(task, env) for c in turn]
            model = [c for turn in calls_per_turn for c in turn]
            value = action_f1(model, truth)
        elif kind == "turn_state":
            value = check.partial
        else:
            value = float(check.valid)
        return {"reward": value, "success": check.valid, "detail": check.error_type or ""}
    except Exception as exc:  # an environment failure is recorded for the episode, not fatal
        return {"reward": 0.0, "success": False, "detail": f"verifier error: {exc}"}
