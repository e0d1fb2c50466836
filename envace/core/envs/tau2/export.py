"""A τ² task's ground truth as a real trajectory (``source: "real"``).

tau2's agent system prompt, the user scenario (airline, retail) or the ticket (telecom) as the
one user turn, the ground-truth actions (``evaluation_criteria.actions``) with their real
responses (retail's ground truth holds 23 calls that fail on purpose: error results), then the
final assistant message: the task's ``communicate_info`` strings, one a line (empty where it has
none), which tau2's communicate check reads. The reward is tau2's own evaluation of those calls.
"""

from __future__ import annotations

from envace.core.envs.recording import real_record, single_turn_messages
from envace.core.envs.tau2.env import TAU2Env
from envace.core.envs.tau2.tasks import TAU2Task
from envace.core.envs.tau2.verify import tau2_messages, tau2_reward
from envace.core.schema import Trajectory


def real_trajectory(task: TAU2Task, env: TAU2Env | None = None,
                    turn_end: bool = True) -> Trajectory:
    """A τ² task's ground truth as a real trajectory; reward from tau2's evaluators."""
    env = env or TAU2Env()
    env.reset(task)
    messages = single_turn_messages(env, task.turn_messages(0), task.calls(), task.final_text,
                                    turn_end)
    tool_msgs = [m for m in messages if m["role"] == "tool"]
    reward, _, _ = tau2_reward(task, tau2_messages(
        task.calls(), [(m["content"], bool(m.get("error"))) for m in tool_msgs],
        task.final_text if turn_end else ""))
    return real_record(task.id, {"name": "tau2", "task": task.id}, messages, task.tools(),
                       {"category": task.domain, "domain": task.domain, "solo": task.solo},
                       reward=float(reward))
