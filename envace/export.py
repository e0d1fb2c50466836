"""Real trajectories: each task's ground-truth calls executed in the real BFCL environment.

    envace data export-real --split dev --out dev.jsonl

Each task becomes one trajectory (`source: "real"`): per turn, the user's message, then one
assistant message per ground-truth call with the real response as a tool message
(``rehearsed: false``), then an empty assistant message that ends the turn (the policy learns to
stop calling tools). A miss_func turn that only restores withheld tools gets a system message
naming them. These files are the SFT data, the audit's determinism check and the source of the
reference world models.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from envace.envs.bfcl import BFCLEnv
from envace.envs.tasks import Task
from envace.envs.verify import ground_truth_calls
from envace.schema import Message, Trajectory


def real_trajectory(task: Task, env: BFCLEnv | None = None, turn_end: bool = True) -> Trajectory:
    """Execute a task's ground truth and record it as a real trajectory."""
    env = env or BFCLEnv()
    env.reset(task)
    messages: list[dict[str, Any]] = []
    step = 0
    for turn, calls in enumerate(ground_truth_calls(task, env)):
        messages.extend(task.turn_messages(turn))
        for name, args in calls:
            call_id = f"c{step}"
            result = env.execute(name, args)
            call = {"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": args}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            tool_msg = {"role": "tool", "tool_call_id": call_id, "name": name,
                        "content": result.content, "rehearsed": False}
            if result.error:
                tool_msg["error"] = True
            messages.append(tool_msg)
            step += 1
        if turn_end:
            messages.append({"role": "assistant", "content": ""})
    return Trajectory(
        id=f"real-{task.id}",
        task_id=task.id,
        env={"name": "bfcl", "task": task.id},
        source="real",
        messages=[Message.model_validate(m) for m in messages],
        tools=task.tools(),
        reward=1.0,
        meta={"category": task.category, "scenario": task.scenario,
              "backends": task.involved_classes},
    )


def export_real(tasks: Iterable[Task], turn_end: bool = True) -> Iterator[Trajectory]:
    env = BFCLEnv()
    for task in tasks:
        yield real_trajectory(task, env, turn_end=turn_end)
