"""MCP tasks: plain JSON lines in the user's task file (``docs/spec/mcp_profile.md``).

One object per line: ``{"id", "prompt", "state": {"files": {relative path: text}},
"ground_truth": [[tool, {args}], ...]}`` and, optionally, ``"split"`` (``train``, ``dev``,
``test``: what rollout, train and eval pick from; a task without one is only in ``all``) and
``"cluster"`` (tasks sharing one are one resampling unit of the audit's intervals). A task
file names no command: which server runs it is the profile of ``--env mcp:<profile>``. A bad
line costs that line (reported with its number and reason), never the file.

    tasks, problems = load_tasks("tasks.jsonl", "mcp:ledger")
    tasks[0].calls()          # [("add_entry", {"account": "rent", "amount": -1200}), ...]
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from envace.core.envs.mcp.env import profile_tools
from envace.core.envs.mcp.taskfile import check_task, read_task_file
from envace.core.envs.task_common import TaskRecord


@dataclass
class McpTask(TaskRecord):
    """One task of a task file, shaped like the other families' tasks for rollout and eval
    (``turns``, ``turn_messages``, ``opening_messages``, ``tools``, ``base_id``, ...)."""

    id: str
    prompt: str
    files: dict[str, str]
    ground_truth: list[tuple[str, dict[str, Any]]]
    env_name: str
    split: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    cluster: str | None = None  #: tasks sharing one are one resampling unit (the audit's)
    turns: list[list[dict[str, str]]] = field(default_factory=list)
    base_id: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.turns:
            self.turns = [[{"role": "user", "content": self.prompt}]]

    @property
    def state(self) -> dict[str, Any]:
        """The initial state, as a trajectory's ``env.state`` holds it."""
        return {"files": dict(self.files)}

    @property
    def category(self) -> str:
        return self.env_name

    @property
    def primary_backend(self) -> str:
        return self.env_name

    def tools(self, turn: int | None = None) -> list[dict[str, Any]]:
        """The server's tools (listed once per process and profile, from this task's state)."""
        return profile_tools(self)

    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        return [(n, dict(a)) for n, a in self.ground_truth]

    def env_record(self) -> dict[str, Any]:
        """A trajectory's ``env``: the profile and the initial state inline (replay needs no
        task file)."""
        return {"name": self.env_name, "state": self.state}


def parse_task(raw: Any, env_name: str) -> McpTask:
    """One task from its JSON object (:func:`~envace.core.envs.mcp.taskfile.check_task`);
    ValueError naming the bad field."""
    return McpTask(**check_task(raw), env_name=env_name)


def load_tasks(path: str | os.PathLike[str], env_name: str
               ) -> tuple[list[McpTask], list[dict[str, Any]]]:
    """(tasks, problems) of a task file (:func:`~envace.core.envs.mcp.taskfile.read_task_file`);
    :class:`~envace.core.envs.mcp.taskfile.TaskFileError` if the file cannot be read."""
    records, problems = read_task_file(path)
    return [McpTask(**r, env_name=env_name) for r in records], problems
