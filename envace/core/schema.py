"""Trajectory records (`envace.trajectory/1`) and their JSONL reader and writer.

The contract is `docs/spec/trajectory.md`. Every part of envace (rollouts, trainer, audit,
dashboard) reads and writes trajectories through this module.

- Unknown fields are kept (pydantic ``extra="allow"``) so a read-write round trip loses nothing.
- Tool-call ``arguments`` are accepted as a JSON object or a JSON string; a string that is not a
  JSON object marks the call *malformed* (kept, counted, replayed as the environment answers it).
- :func:`read_trajectories` streams a file and reports each bad line (number, reason) and a
  truncated last line without stopping; :class:`TrajectoryWriter` appends one record per line,
  flushed (optionally fsynced) after each.

Usage::

    from envace.core.schema import read_trajectories, TrajectoryWriter
    for item in read_trajectories("runs/x/rollouts/step_3.jsonl"):
        if item.error: print(item.line, item.error)
        else: print(item.trajectory.id, len(item.trajectory.tool_steps()))
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from envace.core.jsonfast import loads_noting_nonfinite

SCHEMA_ID = "envace.trajectory/1"
#: Size limits (docs/audit.md, "Size limits"), the same for every reader and writer: a JSONL
#: line (a trajectory, a step row) longer than MAX_LINE_BYTES is one skipped record, never
#: parsed nor written; a tool call's arguments (as JSON) or one response text longer than
#: MAX_CALL_BYTES (UTF-8) makes its trajectory one skipped record, before any replay.
MAX_LINE_BYTES = 64 * 1024 * 1024
MAX_CALL_BYTES = 1024 * 1024
#: the read buffer of a trajectory file: a line (20 kB and more) is found in it at once, not
#: gathered from 8 kB reads (a line read in 5.5 us, not 13.5: issue 44)
READ_BUFFER_BYTES = 1024 * 1024


class RecordTooLarge(ValueError):
    """A record whose line would pass :data:`MAX_LINE_BYTES` (it is not written)."""


def utf8_len(text: str) -> int:
    """Bytes of ``text`` as written (a lone surrogate counts as its escape)."""
    return len(text.encode("utf-8", "surrogatepass"))


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def dump(self) -> dict[str, Any]:
        """The record as plain JSON data: unset optional fields omitted, unknown fields kept."""
        return self.model_dump(mode="json", exclude_unset=True, by_alias=True)


class FunctionCall(_Model):
    """The called function: its name and keyword arguments."""

    name: str = Field(description="Tool name as the model wrote it.")
    arguments: Any = Field(
        default_factory=dict,
        description="Keyword arguments: a JSON object, or a JSON string (OpenAI wire form).",
    )

    @property
    def parsed_arguments(self) -> tuple[dict[str, Any] | None, str | None]:
        """(arguments as a dict, None) or (None, reason) when the call is malformed."""
        return parse_arguments(self.arguments)


class ToolCall(_Model):
    """One call in an assistant message (OpenAI/HF tool-calling convention)."""

    id: str = Field(description="Call id; the tool message answering it carries it.")
    type: str = Field(default="function", description="Always 'function'.")
    function: FunctionCall = Field(description="Name and arguments.")


class Message(_Model):
    """A chat message. ``role`` decides which optional fields mean something."""

    role: Literal["system", "user", "assistant", "tool"] = Field(description="Who speaks.")
    content: str | None = Field(default="", description="Text; for a tool, its response.")
    tool_calls: list[ToolCall] | None = Field(
        default=None, description="Assistant only: calls it makes (absent/empty: final answer)."
    )
    tool_call_id: str | None = Field(default=None, description="Tool only: the call answered.")
    name: str | None = Field(default=None, description="Tool only: the tool's name.")
    rehearsed: bool | None = Field(
        default=None, description="Tool only: true if the policy/simulator wrote the content."
    )
    error: bool | None = Field(
        default=None, description="Tool only, optional: the writer believes this is a failure."
    )
    logprob: float | None = Field(default=None, description="Sum of generated tokens' logprobs.")
    num_tokens: int | None = Field(default=None, description="Generated tokens in this message.")

    @field_validator("content", mode="before")
    @classmethod
    def _none_content(cls, v: Any) -> Any:
        return "" if v is None else v


class Trajectory(_Model):
    """One episode: the record every part of envace shares."""

    schema_: Literal["envace.trajectory/1"] = Field(
        default=SCHEMA_ID, alias="schema", description="Format id, 'envace.trajectory/1'."
    )
    id: str = Field(description="Unique within the file.")
    task_id: str = Field(description="The task this episode attempted.")
    env: dict[str, Any] = Field(
        description="{'name': env, 'task': id} or {'name': env, 'state': {...}} (inline state)."
    )
    source: str = Field(description="Who wrote tool responses: rehearsal, real, simulator, ...")
    messages: list[Message] = Field(description="The conversation, in order.")
    model: str | None = Field(default=None, description="Model name or path.")
    tools: list[dict[str, Any]] | None = Field(default=None, description="Tool schemas offered.")
    reward: float | None = Field(default=None, description="Episode reward, if scored.")
    meta: dict[str, Any] = Field(default_factory=dict, description="Free-form metadata.")

    @field_validator("env")
    @classmethod
    def _env_has_name(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(v.get("name"), str):
            raise ValueError("env needs a 'name' (e.g. 'bfcl')")
        if "task" not in v and "state" not in v:
            raise ValueError("env needs 'task' (a task id) or 'state' (inline initial state)")
        return v

    def tool_steps(self) -> list[ToolStep]:
        """Every tool call in order (the *step index* is its position), with its response."""
        return tool_steps(self)

    def dump(self) -> dict[str, Any]:
        data = super().dump()
        return {"schema": SCHEMA_ID, **data}

    def to_json(self) -> str:
        return json_text(self.dump())


@dataclass(frozen=True)
class ToolStep:
    """A tool call and the recorded response to it (None when unanswered)."""

    step: int
    message_index: int
    call_id: str
    tool: str
    arguments: dict[str, Any] | None  # None when malformed
    malformed: str | None  # reason the arguments could not be parsed
    raw_arguments: Any
    response: Message | None


def parse_arguments(arguments: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Arguments as a dict, accepting a JSON object or a JSON string; never raises."""
    if isinstance(arguments, dict):
        return arguments, None
    if arguments is None:
        return {}, None
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}, None
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError) as exc:  # ValueError: also an over-long integer
            return None, f"arguments are not valid JSON: {exc or 'nested too deeply'}"
        if isinstance(value, dict):
            return value, None
        return None, f"arguments must be a JSON object, got {type(value).__name__}"
    return None, f"arguments must be an object or a JSON string, got {type(arguments).__name__}"


def tool_steps(traj: Trajectory) -> list[ToolStep]:
    """Pair each call with its tool message (by id; falling back to order after the call)."""
    answers: dict[str, tuple[int, Message]] = {}
    for i, m in enumerate(traj.messages):
        if m.role == "tool" and m.tool_call_id is not None and m.tool_call_id not in answers:
            answers[m.tool_call_id] = (i, m)
    steps: list[ToolStep] = []
    for i, m in enumerate(traj.messages):
        if m.role != "assistant" or not m.tool_calls:
            continue
        for call in m.tool_calls:
            args, reason = parse_arguments(call.function.arguments)
            answer = answers.get(call.id)
            steps.append(
                ToolStep(
                    step=len(steps),
                    message_index=i,
                    call_id=call.id,
                    tool=call.function.name,
                    arguments=args,
                    malformed=reason,
                    raw_arguments=call.function.arguments,
                    response=answer[1] if answer else None,
                )
            )
    return steps


@dataclass(frozen=True)
class ReadItem:
    """One line of a trajectory file: a trajectory, or the reason it could not be read."""

    path: str
    line: int  # 1-based
    trajectory: Trajectory | None = None
    error: str | None = None
    raw: str | None = None  # the start of the bad line, for the report
    #: False when the line cannot hold a non-finite number (:func:`may_hold_nonfinite`)
    maybe_nonfinite: bool = True
    #: the line's bytes as read (None: not known)
    size: int | None = None


def may_hold_nonfinite(traj: Trajectory, parsed_nonfinite: bool = True) -> bool:
    """Whether a trajectory may hold a non-finite number where the audit looks for one
    (``audit.pipeline.nonfinite_paths``: any value, and the JSON text of a call's arguments).
    False is certain; True means the walk must look (and, but for a number that validation
    dropped, finds one). ``parsed_nonfinite``: whether the JSON it was parsed from held one
    (NaN, an infinity, a literal past the float range: :func:`_loads` notes it as it parses,
    at no cost); then the typed float fields (validation turns a string such as ``"inf"`` into
    a float in ``reward`` and a message's ``logprob``) and each call's arguments given as JSON
    text. The audit so walks no record for what almost none holds."""
    if parsed_nonfinite:
        return True
    if any(isinstance(v, float) and not math.isfinite(v)
           for v in (traj.reward, *(m.logprob for m in traj.messages))):
        return True
    for m in traj.messages:
        for c in m.tool_calls or ():
            args = c.function.arguments
            if isinstance(args, str) and args[:1] == "{":
                try:
                    if _loads(args)[1]:
                        return True
                except (ValueError, RecursionError):
                    continue  # not JSON: the walk finds nothing there either
    return False


def _loads(text: str, raw: bytes | None = None) -> tuple[Any, bool]:
    """``json.loads(text)`` and whether a number in it was non-finite (the constants NaN and
    Infinity, or a float literal such as 1e999), by orjson where that gives the same objects
    (``envace.core.jsonfast``; ``raw``: the text's UTF-8 bytes, when the caller has them)."""
    return loads_noting_nonfinite(text, raw)


def _describe(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors()[:3]:
        loc = ".".join(str(x) for x in e["loc"]) or "(record)"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


def parse_line(text: str) -> tuple[Trajectory | None, str | None]:
    """Parse one JSONL line into a trajectory, or return the reason it is not one."""
    traj, err, _ = _parse_line(text)
    return traj, err


def _parse_line(text: str, raw: bytes | None = None
                ) -> tuple[Trajectory | None, str | None, bool]:
    """:func:`parse_line`, and whether the JSON held a non-finite number (``raw``: the text's
    UTF-8 bytes, when the caller has them)."""
    try:
        data, nonfinite = _loads(text, raw)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON: {exc.msg} at column {exc.colno}", True
    except RecursionError:
        return None, "invalid JSON: nested too deeply", True
    except ValueError as exc:  # an integer longer than Python converts (sys.int_info)
        return None, f"invalid JSON: {str(exc).split(';')[0]}", True
    if not isinstance(data, dict):
        return None, f"a record must be a JSON object, got {type(data).__name__}", True
    if data.get("schema") != SCHEMA_ID:
        got = data.get("schema")
        got = (repr(got[:60]) if isinstance(got, str) else "missing" if got is None
               else f"a {type(got).__name__}")
        return None, f"schema is {got}, expected {SCHEMA_ID!r}", True
    try:
        return Trajectory.model_validate(data), None, nonfinite
    except ValidationError as exc:
        return None, f"not a valid trajectory: {_describe(exc)}", True
    except RecursionError:
        return None, "not a valid trajectory: nested too deeply", True


def bounded_lines(fh: Any, keep_long: bool = False) -> Iterator[tuple[int, bytes, bool]]:
    """``(line number, bytes, too long)`` for each line of a binary file. A line over
    ``MAX_LINE_BYTES`` is flagged and, unless ``keep_long``, not held in memory (its bytes are
    empty); with ``keep_long`` it is returned whole, so a caller can keep it verbatim."""
    lineno = 0
    while True:
        raw = fh.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        lineno += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            kept = raw if keep_long else b""
            while raw and not raw.endswith(b"\n"):  # the rest of the oversized line
                raw = fh.readline(MAX_LINE_BYTES)
                if keep_long:
                    kept += raw
            yield lineno, kept, True
            continue
        yield lineno, raw, False


def read_trajectories(path: str | os.PathLike[str]) -> Iterator[ReadItem]:
    """Stream a JSONL file: one :class:`ReadItem` per non-blank line, bad lines included.

    Non-UTF-8 bytes, invalid JSON, schema violations and a truncated last line (no newline and
    not parseable) are reported with their line number; reading goes on.
    """
    p = str(path)
    with open(p, "rb", buffering=READ_BUFFER_BYTES) as fh:
        for lineno, raw, too_long in bounded_lines(fh):
            item = read_line(p, lineno, raw, too_long)
            if item is not None:
                yield item


def read_line(path: str, lineno: int, raw: bytes, too_long: bool = False) -> ReadItem | None:
    """One line of a trajectory file as :func:`read_trajectories` reads it (``raw``, ``too_long``:
    as :func:`bounded_lines` gives them); None for a blank line. The audit's workers read the
    lines their parent hands them with it (``audit.workers``)."""
    if too_long:
        return ReadItem(path, lineno, error=f"line longer than {MAX_LINE_BYTES} bytes")
    ended = raw.endswith(b"\n")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ReadItem(path, lineno, error=f"not UTF-8 at byte {exc.start}", raw=None)
    if not text.strip():
        return None
    traj, err, nonfinite = _parse_line(text, raw)
    if err and not ended:
        err = f"truncated last line (no newline): {err}"
    return ReadItem(path, lineno, trajectory=traj, error=err, raw=None if traj else text[:200],
                    maybe_nonfinite=traj is None or may_hold_nonfinite(traj, nonfinite),
                    size=len(raw))


def load_trajectories(path: str | os.PathLike[str]) -> list[Trajectory]:
    """All readable trajectories of a file (bad lines skipped: read_trajectories shows them)."""
    return [it.trajectory for it in read_trajectories(path) if it.trajectory is not None]


def json_text(data: Any, **kw: Any) -> str:
    """``json.dumps(data, ensure_ascii=False)``, unless the text holds a lone surrogate (valid
    JSON ``"\\ud800"`` decodes to one) that UTF-8 cannot write: then ``ensure_ascii=True`` for
    this value, which reads back as the same data. Every JSON writer goes through this, so a
    surrogate never crashes a writer nor changes what is written for any other text."""
    text = json.dumps(data, ensure_ascii=False, **kw)
    if text.isascii():  # O(1) in CPython: no surrogate, and no copy to find that out
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(data, ensure_ascii=True, **kw)
    return text


class TrajectoryWriter:
    """Append-only JSONL writer: one record per line, flushed after each (fsync optional).

    Use as a context manager. Records are written whole; a crash leaves at most a partial last
    line, which readers report as truncated.
    """

    def __init__(self, path: str | os.PathLike[str], fsync: bool = False, mode: str = "a"):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._fh = open(self.path, mode, encoding="utf-8")  # noqa: SIM115 (closed by close())

    def write(self, record: Trajectory | dict[str, Any]) -> None:
        """Append one record; :class:`RecordTooLarge` (nothing written) past the line limit."""
        data = record.dump() if isinstance(record, BaseModel) else record
        line = json_text(data) + "\n"
        if len(line) > MAX_LINE_BYTES // 4 and utf8_len(line) > MAX_LINE_BYTES:
            raise RecordTooLarge(f"record of {utf8_len(line)} bytes is longer than the "
                                 f"{MAX_LINE_BYTES}-byte line limit: not written")
        self._fh.write(line)
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_trajectories(
    path: str | os.PathLike[str], records: list[Trajectory], append: bool = False
) -> None:
    """Write a whole file (or append to one) of trajectories."""
    with TrajectoryWriter(path, mode="a" if append else "w") as w:
        for r in records:
            w.write(r)
