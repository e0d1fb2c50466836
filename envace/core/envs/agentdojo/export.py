"""An AgentDojo user task's ground truth as a real trajectory (``source: "real"``).

One user turn, the ground-truth calls with their real responses, then the task's expected answer
as the final assistant message; ``env`` records the benchmark version; the reward is the task's
own utility check of those calls.
"""

from __future__ import annotations

from envace.core.envs.agentdojo.env import AgentDojoEnv
from envace.core.envs.agentdojo.tasks import AgentDojoTask
from envace.core.envs.agentdojo.verify import check_calls
from envace.core.envs.recording import real_record, single_turn_messages
from envace.core.schema import Trajectory


def real_trajectory(task: AgentDojoTask, env: AgentDojoEnv | None = None,
                    turn_end: bool = True) -> Trajectory:
    """An AgentDojo task's ground truth as a real trajectory; reward from its own checker."""
    env = env or AgentDojoEnv(task.version)
    env.reset(task)
    messages = single_turn_messages(env, task.turn_messages(0), task.calls(),
                                    task.ground_truth_output, turn_end)
    check = check_calls(task, task.calls(), task.ground_truth_output)
    return real_record(task.id, {"name": "agentdojo", "task": task.id, "version": task.version},
                       messages, task.tools(),
                       {"category": task.suite, "suite": task.suite, "version": task.version,
                        "difficulty": task.difficulty},
                       reward=1.0 if check.valid else 0.0)
