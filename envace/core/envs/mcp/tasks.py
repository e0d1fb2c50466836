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

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.core.envs.mcp.workdir import StateError, check_files

TASKS_ENV = "ENVACE_MCP_TASKS"
SPLITS = ("train", "dev", "test")
_KEYS = {"id", "prompt", "state", "ground_truth", "split", "meta", "cluster"}


class TaskFileError(ValueError):
    """A task file that cannot be read at all, or a task id it lacks."""


@dataclass
class McpTask:
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

    def turn_messages(self, turn: int) -> list[dict[str, str]]:
        return [dict(m) for m in self.turns[turn]]

    def opening_messages(self) -> list[dict[str, Any]]:
        return self.turn_messages(0)

    def tools(self, turn: int | None = None) -> list[dict[str, Any]]:
        """The server's tools (listed once per process and profile, from this task's state)."""
        from envace.core.envs.mcp.family import profile_tools

        return profile_tools(self)

    def tool_names(self) -> set[str]:
        return {s["function"]["name"] for s in self.tools()}

    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        return [(n, dict(a)) for n, a in self.ground_truth]

    def env_record(self) -> dict[str, Any]:
        """A trajectory's ``env``: the profile and the initial state inline (replay needs no
        task file)."""
        return {"name": self.env_name, "state": self.state}


def parse_task(raw: Any, env_name: str) -> McpTask:
    """One task from its JSON object; ValueError naming the bad field."""
    if not isinstance(raw, dict):
        raise ValueError("a task is a JSON object")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(_KEYS))}")
    tid, prompt = raw.get("id"), raw.get("prompt", "")
    if not isinstance(tid, str) or not tid or len(tid) > 200:
        raise ValueError("'id' must be a non-empty string (at most 200 characters)")
    if not isinstance(prompt, str):
        raise ValueError("'prompt' must be a string")
    state = raw.get("state", {})
    if not isinstance(state, dict) or set(state) - {"files"}:
        raise ValueError("'state' must be an object with only 'files'")
    try:
        files = check_files(state.get("files", {}))
    except StateError as exc:
        raise ValueError(str(exc)) from None
    calls = []
    gt = raw.get("ground_truth", [])
    if not isinstance(gt, list):
        raise ValueError("'ground_truth' must be a list of [tool, {arguments}]")
    for i, call in enumerate(gt):
        if (not isinstance(call, list) or len(call) != 2 or not isinstance(call[0], str)
                or not isinstance(call[1], dict)):
            raise ValueError(f"ground_truth[{i}] must be [tool name, {{arguments}}]")
        calls.append((call[0], call[1]))
    split = raw.get("split")
    if split is not None and split not in SPLITS:
        raise ValueError(f"'split' must be one of {', '.join(SPLITS)}")
    meta = raw.get("meta", {})
    if not isinstance(meta, dict):
        raise ValueError("'meta' must be an object")
    cluster = raw.get("cluster")
    if cluster is not None and (not isinstance(cluster, str) or not cluster):
        raise ValueError("'cluster' must be a non-empty string")
    return McpTask(id=tid, prompt=prompt, files=files, ground_truth=calls, env_name=env_name,
                   split=split, meta=meta, cluster=cluster)


def load_tasks(path: str | os.PathLike[str], env_name: str
               ) -> tuple[list[McpTask], list[dict[str, Any]]]:
    """(tasks, problems) of a task file; each problem is ``{"file", "line", "reason"}`` (a bad
    line or a repeated id); :class:`TaskFileError` if the file cannot be read."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskFileError(f"cannot read the task file {p}: {exc}") from None
    tasks: list[McpTask] = []
    problems: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            task = parse_task(json.loads(line), env_name)
            if task.id in seen:
                raise ValueError(f"task id {task.id!r} repeats an earlier line's")
        except (ValueError, RecursionError) as exc:
            problems.append({"file": str(p), "line": n, "reason": str(exc)[:300]})
            continue
        seen.add(task.id)
        tasks.append(task)
    return tasks, problems


def tasks_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The task file in use: ``explicit``, else ``$ENVACE_MCP_TASKS``."""
    path = explicit or os.environ.get(TASKS_ENV)
    if not path:
        raise TaskFileError(f"MCP tasks come from a task file: pass --mcp-tasks FILE or set "
                            f"{TASKS_ENV}")
    return Path(path)
