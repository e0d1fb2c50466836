"""Task success for BFCL multi-turn tasks: BFCL's state check, without ``eval``.

Mirrors bfcl-eval's ``multi_turn_checker``: the model's calls of each turn and the ground-truth
calls of that turn run in two environments reset from the same initial state; after every turn
whose ground truth is non-empty, (1) the turn must have at least one call, (2) every backend's
public attributes must be equal (``==``, as BFCL compares them), and (3) the ground truth's
responses of that turn must all appear (as a multiset) among the model's responses so far.

``check_calls`` is the verifier the trainer's reward uses; ``partial`` is the share of such turns
passed before the first failure (the per-turn partial credit option).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envace.core.envs.bfcl.env import BFCLEnv
from envace.core.envs.bfcl.tasks import Task
from envace.core.rewards import action_f1, partial_action_f1

Call = tuple[str, dict[str, Any]]


@dataclass
class CheckResult:
    """The outcome of a state check."""

    valid: bool
    turns_checked: int = 0
    turns_passed: int = 0
    error_type: str | None = None
    message: str = ""
    failed_turn: int | None = None
    responses: list[list[str]] = field(default_factory=list)  # the model's real responses

    @property
    def partial(self) -> float:
        return self.turns_passed / self.turns_checked if self.turns_checked else 0.0


def compare_instances(model: Any, truth: Any) -> dict[str, tuple[Any, Any]]:
    """Public attributes that differ (BFCL's ``_compare_instances``)."""
    diffs = {}
    for name in vars(truth):
        if name.startswith("_"):
            continue
        a, b = getattr(model, name, None), getattr(truth, name)
        if a != b:
            diffs[name] = (a, b)
    return diffs


def _multiset_missing(needed: list[str], have: list[str]) -> list[str]:
    pool = list(have)
    missing = []
    for item in needed:
        try:
            pool.remove(item)
        except ValueError:
            missing.append(item)
    return missing


def ground_truth_calls(task: Task, env: BFCLEnv) -> list[list[Call]]:
    """The task's ground truth as (name, keyword arguments) per turn."""
    return [[(c.name, env.bind(c.name, list(c.args), c.kwargs)) for c in turn]
            for turn in task.ground_truth]


def check_calls(task: Task, calls_per_turn: list[list[Call]]) -> CheckResult:
    """BFCL's multi-turn state check of the model's calls per turn against the ground truth."""
    model_env, truth_env = BFCLEnv(), BFCLEnv()
    model_env.reset(task)  # a per-turn task's reset replays its prefix in both
    truth_env.reset(task)
    truth_turns = ground_truth_calls(task, truth_env)
    result = CheckResult(valid=True)
    all_model_responses: list[str] = []
    for turn, truth_calls in enumerate(truth_turns):
        model_calls = calls_per_turn[turn] if turn < len(calls_per_turn) else []
        responses = [model_env.execute(name, args).content for name, args in model_calls]
        result.responses.append(responses)
        all_model_responses.extend(responses)
        truth_responses = [truth_env.execute(name, args).content for name, args in truth_calls]
        if not truth_calls:
            continue
        result.turns_checked += 1
        if result.valid:
            failure = _check_turn(model_env, truth_env, model_calls, truth_responses,
                                  all_model_responses)
            if failure:
                result.valid = False
                result.error_type, result.message = failure
                result.failed_turn = turn
            else:
                result.turns_passed += 1
    return result


def _check_turn(model_env: BFCLEnv, truth_env: BFCLEnv, model_calls: list[Call],
                truth_responses: list[str], all_model_responses: list[str]
                ) -> tuple[str, str] | None:
    if not model_calls:
        return "multi_turn:empty_turn_model_response", "no call in a turn that needs one"
    for cls, truth in truth_env.instances.items():
        diffs = compare_instances(model_env.instances[cls], truth)
        if diffs:
            return "multi_turn:instance_state_mismatch", f"{cls} differs in {sorted(diffs)}"
    missing = _multiset_missing(truth_responses, all_model_responses)
    if missing:
        return ("multi_turn:execution_response_mismatch",
                f"{len(missing)} ground-truth responses never returned, e.g. {missing[0][:120]!r}")
    return None


def reward(kind: str, task: Task, calls_per_turn: list[list[Call]],
           final_text: str = "") -> dict[str, Any]:
    """The family's verifier (``envace.core.rewards.task_reward`` calls it): ``state`` is the
    state check, ``turn_state`` its per-turn share, ``action``/``action_partial`` the F1 of the
    committed calls against the ground truth's (bound to keyword arguments by the backend)."""
    check = check_calls(task, calls_per_turn)
    if kind in ("action", "action_partial"):
        env = BFCLEnv()
        env.reset(task)
        truth = [c for turn in ground_truth_calls(task, env) for c in turn]
        model = [c for turn in calls_per_turn for c in turn]
        value = (action_f1 if kind == "action" else partial_action_f1)(model, truth)
    elif kind == "turn_state":
        value = check.partial
    else:
        value = float(check.valid)
    return {"reward": value, "success": check.valid, "detail": check.error_type or ""}
