"""A BFCL task's ground truth as a real trajectory (``source: "real"``).

Per turn: the user's message, then one assistant message per ground-truth call with the real
response as a tool message (``rehearsed: false``), then an empty assistant message that ends the
turn (the policy learns to stop calling tools). A miss_func turn that only restores withheld
tools gets a system message naming them (``Task.turn_messages``).
"""

from __future__ import annotations

from typing import Any

from envace.core.envs.bfcl.env import BFCLEnv
from envace.core.envs.bfcl.tasks import Task
from envace.core.envs.bfcl.verify import ground_truth_calls
from envace.core.envs.recording import real_record, run_calls
from envace.core.schema import Trajectory


def real_trajectory(task: Task, env: BFCLEnv | None = None, turn_end: bool = True) -> Trajectory:
    """Execute a task's ground truth and record it as a real trajectory."""
    env = env or BFCLEnv()
    env.reset(task)
    messages: list[dict[str, Any]] = []
    step = 0
    for turn, calls in enumerate(ground_truth_calls(task, env)):
        messages.extend(task.turn_messages(turn))
        step = run_calls(env, calls, messages, step)
        if turn_end:
            messages.append({"role": "assistant", "content": ""})
    return real_record(task.id, {"name": "bfcl", "task": task.id}, messages, task.tools(),
                       {"category": task.category, "scenario": task.scenario,
                        "backends": task.involved_classes}, reward=1.0)
