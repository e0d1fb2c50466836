"""An AgentDojo user task's ground truth as a real trajectory (``source: "real"``).

One user turn, the ground-truth calls with their real responses, then the task's expected answer
as the final assistant message; ``env`` records the benchmark version; the reward is the task's
own utility check of those calls.
"""

from __future__ import annotations

from typing import Any

from envace.core.envs.agentdojo.env import AgentDojoEnv
from envace.core.envs.agentdojo.tasks import AgentDojoTask
from envace.core.envs.agentdojo.verify import check_calls
from envace.core.export import run_calls
from envace.core.schema import Message, Trajectory


def real_trajectory(task: AgentDojoTask, env: AgentDojoEnv | None = None,
                    turn_end: bool = True) -> Trajectory:
    """An AgentDojo task's ground truth as a real trajectory; reward from its own checker."""
    env = env or AgentDojoEnv(task.version)
    env.reset(task)
    messages: list[dict[str, Any]] = task.turn_messages(0)
    run_calls(env, task.calls(), messages, 0)
    if turn_end:
        messages.append({"role": "assistant", "content": task.ground_truth_output})
    check = check_calls(task, task.calls(), task.ground_truth_output)
    return Trajectory(
        id=f"real-{task.id}",
        task_id=task.id,
        env={"name": "agentdojo", "task": task.id, "version": task.version},
        source="real",
        messages=[Message.model_validate(m) for m in messages],
        tools=task.tools(),
        reward=1.0 if check.valid else 0.0,
        meta={"category": task.suite, "suite": task.suite, "version": task.version,
              "difficulty": task.difficulty},
    )
