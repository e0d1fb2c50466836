"""How every family records a task's ground truth as a real trajectory (``source: "real"``).

:func:`run_calls` executes calls and appends the assistant and tool messages; a single-turn
family (AgentDojo, τ², MCP, a plugin) opens with its task's first turn, runs its ground truth
and closes the turn (:func:`single_turn_messages`); :func:`real_record` makes the trajectory
record of any family. Each family's ``export.py`` says what its ``env``, reward and ``meta`` are.
"""

from __future__ import annotations

from typing import Any

from envace.core.envs.base import Environment
from envace.core.schema import MAX_CALL_BYTES, Message, Trajectory, json_text, utf8_len


class ExportSkip(Exception):
    """A task whose real trajectory cannot be recorded (a call past its limit)."""


def run_calls(env: Environment, calls: list[tuple[str, dict[str, Any]]],
              messages: list[dict[str, Any]], step: int) -> int:
    """Execute calls, appending one assistant message and one tool message per call; a call
    past its limit is no real response and is never written as one (:class:`ExportSkip`)."""
    for name, args in calls:
        call_id = f"c{step}"
        size = utf8_len(json_text(args))
        if size > MAX_CALL_BYTES:  # the limit every reader applies (docs/audit.md, size limits)
            raise ExportSkip(f"call {step} ({name!r:.80}): arguments of {size} bytes pass the "
                             f"{MAX_CALL_BYTES}-byte limit of a call")
        result = env.execute(name, args)
        if getattr(result, "timeout", False) or getattr(result, "crashed", False):
            raise ExportSkip(f"call {step} ({name!r:.80}): {result.content[:200]}")
        if (len(result.content) > MAX_CALL_BYTES // 4
                and (size := utf8_len(result.content)) > MAX_CALL_BYTES):
            raise ExportSkip(f"call {step} ({name!r:.80}): the real response of {size} bytes "
                             f"passes the {MAX_CALL_BYTES}-byte limit of a response")
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        tool_msg = {"role": "tool", "tool_call_id": call_id, "name": name,
                    "content": result.content, "rehearsed": False}
        if result.error:
            tool_msg["error"] = True
        messages.append(tool_msg)
        step += 1
    return step


def single_turn_messages(env: Environment, opening: list[dict[str, Any]],
                         calls: list[tuple[str, dict[str, Any]]], final_text: str = "",
                         turn_end: bool = True) -> list[dict[str, Any]]:
    """The messages of a single-turn task's ground truth: its opening messages, each call with
    its real response (:func:`run_calls`), then (``turn_end``) the final assistant message."""
    messages = [dict(m) for m in opening]
    run_calls(env, calls, messages, 0)
    if turn_end:
        messages.append({"role": "assistant", "content": final_text})
    return messages


def real_record(task_id: str, env: dict[str, Any], messages: list[dict[str, Any]],
                tools: list[dict[str, Any]], meta: dict[str, Any],
                reward: float | None = None) -> Trajectory:
    """The real trajectory of a task (``id`` ``real-<task id>``); ``reward`` is left unset
    (not written) when None."""
    return Trajectory(id=f"real-{task_id}", task_id=task_id, env=env, source="real",
                      messages=[Message.model_validate(m) for m in messages], tools=tools,
                      meta=meta, **({} if reward is None else {"reward": reward}))
