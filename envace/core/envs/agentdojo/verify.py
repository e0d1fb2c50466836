"""Task success for AgentDojo user tasks: the task's own checker, on calls run in the adapter.

The calls run in an :class:`~envace.core.envs.agentdojo.env.AgentDojoEnv` reset to the task; the
task's checker then gets what agentdojo's ``TaskSuite.run_task_with_pipeline`` gives it: the final
answer text, the environment before and after, and the calls made (``utility_from_traces``
first; ``utility`` where that says nothing). Some tasks check the answer text, so the final
assistant message matters as well as the calls.

    result = check_calls(get_task("banking/user_task_0"), calls, final_text="...")
    result.valid, result.responses
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envace.core.envs.agentdojo.env import AgentDojoEnv
from envace.core.envs.agentdojo.tasks import AgentDojoTask, deterministic_world
from envace.core.rewards import single_turn_reward

Call = tuple[str, dict[str, Any]]


@dataclass
class AgentDojoCheck:
    """The outcome of a task check."""

    valid: bool
    message: str = ""
    responses: list[str] = field(default_factory=list)  # the real responses, in call order
    errors: int = 0  # calls that returned an error result

    @property
    def partial(self) -> float:
        return 1.0 if self.valid else 0.0


def check_calls(task: AgentDojoTask, calls: list[Call], final_text: str = "",
                env: AgentDojoEnv | None = None) -> AgentDojoCheck:
    """Run ``calls`` from the task's initial state and apply the task's own utility check."""
    env = env or AgentDojoEnv(task.version)
    env.reset(task)
    results = [env.execute(name, args) for name, args in calls]
    user_task = task.user_task()
    try:
        with deterministic_world():
            verdict = user_task.utility_from_traces(final_text, env.pre_environment,
                                                    env.environment, env.trace)
            if verdict is None:
                verdict = user_task.utility(final_text, env.pre_environment, env.environment)
        message = "" if verdict else "the task's utility check failed"
    except Exception as exc:  # a checker that trips over unexpected state: a failure
        verdict, message = False, f"checker raised {type(exc).__name__}: {exc}"
    return AgentDojoCheck(valid=bool(verdict), message=message,
                          responses=[r.content for r in results],
                          errors=sum(r.error for r in results))


def reward(kind: str, task: AgentDojoTask, calls_per_turn: list[list[Call]],
           final_text: str = "") -> dict[str, Any]:
    """The family's verifier: ``state``/``turn_state`` are the task's utility check (one turn,
    so the share of turns passed is the verdict), ``action``/``action_partial`` the F1 of the
    committed calls against the task's ground-truth calls."""
    model = [c for turn in calls_per_turn for c in turn]
    check = check_calls(task, model, final_text)
    return single_turn_reward(kind, model, task.calls(), check.partial, check.valid, check.message)
