"""The verifier of MCP tasks: the final state of the workdir against the ground truth's.

``state`` (and ``turn_state``: a task is one user turn) runs the committed calls against a fresh
server reset to the task and compares the workdir's state hash with the one the ground-truth
calls leave (computed once per task and process): 1.0 when they agree. ``action`` and
``action_partial`` are the F1 of the calls against the ground-truth calls
(``envace.core.rewards``). Success is the state check in every kind.

    reward("state", task, [[("add_entry", {...})]], "")   # {"reward", "success", "detail"}
"""

from __future__ import annotations

from typing import Any

from envace.core.envs.mcp.env import mcp_env
from envace.core.envs.mcp.tasks import McpTask

Call = tuple[str, dict[str, Any]]
_TRUTH: dict[tuple[str, str], str] = {}


def final_state_hash(task: McpTask, calls: list[Call]) -> tuple[str, int]:
    """(state hash after ``calls`` from the task's initial state, how many were errors)."""
    with mcp_env(task.env_name) as env:
        env.reset(task)
        errors = sum(env.execute(name, args).error for name, args in calls)
        return env.state_hash(), errors


def truth_hash(task: McpTask) -> str:
    key = (task.env_name, task.id)
    if key not in _TRUTH:
        _TRUTH[key] = final_state_hash(task, task.calls())[0]
    return _TRUTH[key]


def reward(kind: str, task: McpTask, calls_per_turn: list[list[Call]],
           final_text: str = "") -> dict[str, Any]:
    """The family's verifier (see the module docstring)."""
    # lazy: loads numpy: only this path needs it
    from envace.core.rewards import single_turn_reward  # rewards dispatches to the families

    model = [c for turn in calls_per_turn for c in turn]
    got, errors = final_state_hash(task, model)
    ok = got == truth_hash(task)
    detail = "" if ok else f"final workdir state differs from the ground truth's ({errors} " \
                           "error results)"
    return single_turn_reward(kind, model, task.calls(), 1.0 if ok else 0.0, ok, detail)
