"""Task rewards from a verifier that never feeds the policy (computed after the episode).

- ``state``: the environment's task check of the committed calls (1 or 0): BFCL's state check
  against the ground truth; for AgentDojo the task's own utility check
  (``envace/core/envs/agentdojo/verify.py``: the calls run from the task's initial state, the
  episode's final answer text passed as the model output);
- ``turn_state``: the share of checked turns passed before the first failure (partial credit;
  an AgentDojo task is one turn: the same as ``state``);
- ``action``: F1 between the committed calls and the ground-truth calls (name + arguments,
  as multisets), a denser signal for small models;
- ``action_partial``: the same F1 with partial credit per call (0.5 for the right function, the
  other 0.5 shared by its arguments; calls matched one to one, best total): the densest signal,
  for models that rarely get a call exactly right (the tiny preset).

The ground-truth calls of ``action``/``action_partial``: BFCL's per turn, bound to keyword
arguments by the backend's signatures; AgentDojo's as its tasks list them (``task.calls()``).
Which verifier runs is the task's environment (``task.env_name``).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np

from envace.core.envs.family import MCP_PREFIX, family
from envace.core.envs.limits import CallLimits, CallTimeout, limited_call

#: The whole verification of one episode (it executes the committed calls and the ground
#: truth's) runs in a child process under this limit (issue 39): a call that stalls in C code
#: costs that episode's reward (0, ``timeout``), never the run.
VERIFIER_LIMITS = CallLimits()

REWARDS = ("state", "turn_state", "action", "action_partial")
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


def call_credit(model: Call, truth: Call) -> float:
    """Partial credit of one call against one ground-truth call: 0 for another function, else
    0.5 + 0.5 x the share of argument names (of either call) whose values agree."""
    if model[0] != truth[0]:
        return 0.0
    keys = set(model[1]) | set(truth[1])
    if not keys:
        return 1.0
    same = sum(k in model[1] and k in truth[1] and
               json.dumps(model[1][k], sort_keys=True, default=str) ==
               json.dumps(truth[1][k], sort_keys=True, default=str) for k in keys)
    return 0.5 + 0.5 * same / len(keys)


def partial_action_f1(model: list[Call], truth: list[Call]) -> float:
    """F1 with partial credit: the best one-to-one matching of calls (Hungarian algorithm,
    scipy) gives the credited hits; 1.0 when both are empty."""
    if not model and not truth:
        return 1.0
    if not model or not truth:
        return 0.0
    from scipy.optimize import linear_sum_assignment

    credit = np.array([[call_credit(m, t) for t in truth] for m in model])
    rows, cols = linear_sum_assignment(credit, maximize=True)
    hit = float(credit[rows, cols].sum())
    if hit <= 0:
        return 0.0
    p, r = hit / len(model), hit / len(truth)
    return 2 * p * r / (p + r)


def single_turn_reward(kind: str, model: list[Call], truth: list[Call], state_value: float,
                       success: bool, detail: str) -> dict[str, Any]:
    """A verifier's answer for a family whose tasks are one user turn (AgentDojo, τ², MCP):
    ``action``/``action_partial`` score the committed calls against the ground truth's, the
    state kinds take the family's own check (one turn: the share of turns passed is it)."""
    if kind in ("action", "action_partial"):
        value = (action_f1 if kind == "action" else partial_action_f1)(model, truth)
    else:
        value = state_value
    return {"reward": value, "success": success, "detail": detail}


def task_reward(kind: str, task: Any, calls_per_turn: list[list[Call]],
                final_text: str = "") -> dict[str, Any]:
    """{'reward': float, 'success': bool, 'detail': str}; errors become reward 0 with a reason.

    The verifier is the task's family's (``task.env_name``, ``envace/core/envs/<family>/
    verify.py``). ``final_text``: the episode's last assistant message (AgentDojo's checkers read
    the answer text of some tasks; BFCL's ignore it)."""
    if kind not in REWARDS:
        raise ValueError(f"reward must be one of {REWARDS}, got {kind!r}")
    name = getattr(task, "env_name", "bfcl")
    verify = family(name).reward
    # an MCP server is a process of its own with its requests under the limit, and its client's
    # event-loop thread would not survive a fork: it verifies in this process
    limits = CallLimits(None, None) if name.startswith(MCP_PREFIX) else VERIFIER_LIMITS
    try:  # the committed calls run for real: under the call limit, C code included
        return limited_call(verify, (kind, task, calls_per_turn, final_text), limits)
    except CallTimeout as exc:
        return {"reward": 0.0, "success": False, "detail": f"verifier: {exc}", "timeout": True}
    except Exception as exc:  # an environment failure is recorded for the episode, not fatal
        return {"reward": 0.0, "success": False, "detail": f"verifier error: {exc}"}
