"""Task success for τ² tasks: tau2's own evaluators, combined by each task's ``reward_basis``.

The calls run in a :class:`~envace.core.envs.tau2.env.TAU2Env` reset to the task; the calls, their
responses and the final assistant text become tau2 messages, which tau2's evaluators score as
``tau2.evaluator.evaluator.evaluate_simulation`` does with ``EvaluationType.ALL`` (that module
imports ``tau2.registry``, hence litellm, so its combination is restated here, line for line):
``EnvironmentEvaluator`` (the replayed database's hash against the gold database's, and the env
assertions), ``ActionEvaluator`` (every gold action among the calls) and
``CommunicateEvaluator`` (every ``communicate_info`` string in an assistant message); the
reward is the product of those in the task's basis (``DB``/``ENV_ASSERTION``, ``ACTION``,
``COMMUNICATE``). No task of the three domains has ``NL_ASSERTION`` in its basis, so no LLM
judge is ever needed; one that had would be refused, as tau2 refuses it without one.

tau2 scores a simulation 0 when it ended otherwise than by the agent or user stopping; envace's
verifier scores the committed calls of any episode (the rollout records why it ended).

    result = check_calls(get_task("retail/0"), calls, final_text="...")
    result.reward, result.valid, result.detail
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envace.core.envs.tau2.domain import slot_environment, tau2_module
from envace.core.envs.tau2.env import IdSource, TAU2Env, ids_from, new_ids
from envace.core.envs.tau2.tasks import TAU2Task
from envace.core.rewards import single_turn_reward

Call = tuple[str, dict[str, Any]]


@dataclass
class TAU2Check:
    """The outcome of a task check: tau2's reward, and each basis's part."""

    reward: float
    breakdown: dict[str, float] = field(default_factory=dict)
    detail: str = ""
    responses: list[str] = field(default_factory=list)  # the real responses, in call order
    errors: int = 0  # calls that returned an error result

    @property
    def valid(self) -> bool:
        return self.reward == 1.0


def tau2_messages(calls: list[Call], responses: list[tuple[str, bool]], final_text: str
                  ) -> list[Any]:
    """The episode as tau2 messages: one assistant message and its tool message per call, then
    the final assistant text (no user message: tau2's solo mode forbids it, and no evaluator
    reads one)."""
    msg = tau2_module("tau2.data_model.message")
    out: list[Any] = []
    for k, ((name, args), (content, error)) in enumerate(zip(calls, responses, strict=True)):
        call = msg.ToolCall(id=f"c{k}", name=name, arguments=args, requestor="assistant")
        out.append(msg.AssistantMessage(role="assistant", content=None, tool_calls=[call]))
        out.append(msg.ToolMessage(id=f"c{k}", role="tool", content=content,
                                   requestor="assistant", error=error))
    if final_text:
        out.append(msg.AssistantMessage(role="assistant", content=final_text))
    return out


def _plain(calls: list[Call]) -> tuple[list[Call], list[str]]:
    """The calls tau2 can hold (a name and an object of arguments); the rest named."""
    ok, bad = [], []
    for name, args in calls:
        if isinstance(name, str) and isinstance(args, dict):
            ok.append((name, args))
        else:
            bad.append(str(name)[:60])
    return ok, bad


def check_basis(task: TAU2Task) -> None:
    """ValueError for a task whose reward needs an LLM judge (NL assertions in its basis)."""
    crit = task.tau2_task().evaluation_criteria
    if crit is not None and any(b.value == "NL_ASSERTION" for b in crit.reward_basis):
        raise ValueError(f"{task.id}: NL assertions are in the reward basis; they need an LLM "
                         "judge, which envace does not run")


def tau2_reward(task: TAU2Task, messages: list[Any]) -> tuple[float, dict[str, float], str]:
    """tau2's reward of an episode (``evaluate_simulation`` with ``EvaluationType.ALL``)."""
    ev_env = tau2_module("tau2.evaluator.evaluator_env").EnvironmentEvaluator
    ev_action = tau2_module("tau2.evaluator.evaluator_action").ActionEvaluator
    ev_comm = tau2_module("tau2.evaluator.evaluator_communicate").CommunicateEvaluator
    RewardType = tau2_module("tau2.data_model.tasks").RewardType
    t = task.tau2_task()
    if t.evaluation_criteria is None:
        return 1.0, {}, "no evaluation criteria"
    check_basis(task)
    basis = set(t.evaluation_criteria.reward_basis)

    built = []

    def constructor(solo_mode: bool = False) -> Any:
        new_ids()  # tau2 replays the episode in one environment, then the gold actions in another
        built.append(solo_mode)
        return slot_environment(task.domain, len(built) - 1, solo_mode=solo_mode)

    with ids_from(IdSource()):
        env_info = ev_env.calculate_reward(environment_constructor=constructor, task=t,
                                           full_trajectory=messages, solo_mode=task.solo)
    parts: dict[str, float] = {}
    reward = 1.0
    if basis & {RewardType.DB, RewardType.ENV_ASSERTION}:
        parts.update({str(k.value): v for k, v in (env_info.reward_breakdown or {}).items()})
        reward *= env_info.reward
    if RewardType.ACTION in basis:
        info = ev_action.calculate_reward(task=t, full_trajectory=messages)
        parts.update({str(k.value): v for k, v in (info.reward_breakdown or {}).items()})
        reward *= info.reward
    if RewardType.COMMUNICATE in basis:
        info = ev_comm.calculate_reward(task=t, full_trajectory=messages)
        parts.update({str(k.value): v for k, v in (info.reward_breakdown or {}).items()})
        reward *= info.reward
    failed = sorted(k for k, v in parts.items() if v < 1.0)
    return reward, parts, ("" if not failed else f"failed: {', '.join(failed)}")


def check_calls(task: TAU2Task, calls: list[Call], final_text: str = "",
                env: TAU2Env | None = None) -> TAU2Check:
    """Run ``calls`` from the task's initial state and score them with tau2's evaluators."""
    env = env or TAU2Env()
    env.reset(task)
    ok, bad = _plain(calls)
    results = [env.execute(name, args) for name, args in ok]
    messages = tau2_messages(ok, [(r.content, r.error) for r in results], final_text)
    check_basis(task)
    try:
        reward, parts, detail = tau2_reward(task, messages)
    except Exception as exc:  # an evaluator that trips over unexpected state: a failure
        reward, parts, detail = 0.0, {}, f"evaluator raised {type(exc).__name__}: {exc}"[:300]
    if bad:
        detail = (detail + "; " if detail else "") + f"calls tau2 cannot hold: {', '.join(bad)}"
    return TAU2Check(reward=float(reward), breakdown=parts, detail=detail,
                     responses=[r.content for r in results], errors=sum(r.error for r in results))


def reward(kind: str, task: TAU2Task, calls_per_turn: list[list[Call]],
           final_text: str = "") -> dict[str, Any]:
    """The family's verifier: ``state``/``turn_state`` are tau2's reward (one user turn, so the
    share of turns passed is the verdict), ``action``/``action_partial`` the F1 of the committed
    calls against the task's ground-truth calls."""
    model = [c for turn in calls_per_turn for c in turn]
    check = check_calls(task, model, final_text)
    return single_turn_reward(kind, model, task.calls(), check.reward, check.valid, check.detail)
