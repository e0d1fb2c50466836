"""What every environment family's tasks share: the data folder, the unknown-task error, the
ground-truth call record and the task record's common methods (:class:`TaskRecord`).

    from envace.core.envs.task_common import DATA_DIR, GroundTruthCall, TaskRecord, UnknownTask
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parents[3] / "data"


class UnknownTask(KeyError):
    """A task id that is not in the registry."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class GroundTruthCall:
    """One ground-truth call: BFCL's source string and its parsed form."""

    source: str
    name: str
    args: tuple[Any, ...]  # positional literals, as written
    kwargs: dict[str, Any]


def format_call(name: str, kwargs: dict[str, Any]) -> str:
    """A call as source text, ``name(k=v, ...)`` (a ground-truth call's ``source``)."""
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")"


class TaskRecord:
    """The methods a family's task record shares with every other (rollout, eval and export
    read them): the messages that open a turn and an episode, the names of the task's tools,
    and its ground truth as ``(name, keyword arguments)`` calls. A family's dataclass derives
    from it and gives ``turns``, ``tools()`` and (for :meth:`calls`) ``ground_truth``, one list
    of :class:`GroundTruthCall` per turn; it overrides what differs (BFCL's turns restore
    withheld tools, an MCP task's ground truth is flat)."""

    turns: list[list[dict[str, str]]]
    ground_truth: Any

    def tools(self, turn: int | None = None) -> list[dict[str, Any]]:
        raise NotImplementedError

    def turn_messages(self, turn: int) -> list[dict[str, str]]:
        """The messages that open turn ``turn``."""
        return [dict(m) for m in self.turns[turn]]

    def opening_messages(self) -> list[dict[str, Any]]:
        """The prompt of an episode: turn 0's messages."""
        return self.turn_messages(0)

    def tool_names(self) -> set[str]:
        return {s["function"]["name"] for s in self.tools()}

    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        """The ground truth as (name, keyword arguments), in order."""
        return [(c.name, dict(c.kwargs)) for turn in self.ground_truth for c in turn]
