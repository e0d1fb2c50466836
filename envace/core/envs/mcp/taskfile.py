"""The MCP task file: plain JSON lines (``docs/spec/mcp_profile.md``), read and checked.

One object per line: ``{"id", "prompt", "state": {"files": {relative path: text}},
"ground_truth": [[tool, {args}], ...]}`` and, optionally, ``"split"`` (``train``, ``dev``,
``test``) and ``"cluster"``. A bad line costs that line (reported with its number and reason),
never the file. This module knows the format only: the tasks built from it (``McpTask``, whose
tools are its server's) are :mod:`envace.core.envs.mcp.tasks`; the environment reads a task's
state from here when reset by id (``make_env(..., tasks=FILE)``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from envace.core.envs.mcp.workdir import StateError, check_files
from envace.core.errors import UsageError
from envace.core.infile import read_small_text

TASKS_ENV = "ENVACE_MCP_TASKS"
SPLITS = ("train", "dev", "test")
_KEYS = {"id", "prompt", "state", "ground_truth", "split", "meta", "cluster"}

#: The largest task file read (read whole: its tasks are checked before any runs).
MAX_TASK_FILE_BYTES = 256 * 1024 * 1024


class TaskFileError(ValueError):
    """A task file that cannot be read at all, or a task id it lacks."""


def check_task(raw: Any) -> dict[str, Any]:
    """The fields of one task from its JSON object (``id``, ``prompt``, ``files``,
    ``ground_truth``, ``split``, ``meta``, ``cluster``); ValueError naming the bad field."""
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
    return {"id": tid, "prompt": prompt, "files": files, "ground_truth": calls, "split": split,
            "meta": meta, "cluster": cluster}


def read_task_file(path: str | os.PathLike[str]
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the fields of each task, problems) of a task file (:func:`check_task`); each problem is
    ``{"file", "line", "reason"}`` (a bad line or a repeated id); :class:`TaskFileError` if the
    file cannot be read."""
    p = Path(path)
    try:  # a regular file of at most MAX_TASK_FILE_BYTES: a FIFO or a device is never waited on
        lines = read_small_text(p, MAX_TASK_FILE_BYTES, "the task file").splitlines()
    except UsageError as exc:
        raise TaskFileError(str(exc)) from None
    tasks: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            task = check_task(json.loads(line))
            if task["id"] in seen:
                raise ValueError(f"task id {task['id']!r} repeats an earlier line's")
        except (ValueError, RecursionError) as exc:
            problems.append({"file": str(p), "line": n, "reason": str(exc)[:300]})
            continue
        seen.add(task["id"])
        tasks.append(task)
    return tasks, problems


def tasks_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The task file in use: ``explicit``, else ``$ENVACE_MCP_TASKS``."""
    path = explicit or os.environ.get(TASKS_ENV)
    if not path:
        raise TaskFileError(f"MCP tasks come from a task file: pass --mcp-tasks FILE or set "
                            f"{TASKS_ENV}")
    return Path(path)
