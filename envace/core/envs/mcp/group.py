"""A server's process group, ended whole with its session: no forked child outlives it.

The SDK's stdio transport (``mcp.client.stdio``) starts a server in a session of its own
(``start_new_session``: its process group id is its pid), but kills that group only when the
server itself is still running 2 s after its stdin closed. A server that exits at once leaves
the children it forked running, re-parented to init (issue 39: a tool that forks a sleeping
child). :func:`install` makes the transport tell the session which process it started (the
holder of :func:`watch`), and :func:`kill_group` ends whatever is left of that group once the
SDK's shutdown has returned (SIGKILL: the server had its grace, its children have nobody left
to answer). A child that left the group (``setpgid``) or made a session of its own is still the
server's descendant while the server runs: :func:`descendants`, taken just before the shutdown
(Linux, from ``/proc``), names those too and :func:`kill_group` ends them (each checked by its
start time, so a reused pid is never hit). Only what was re-parented before that moment (a
daemon's double fork, a server that died earlier) escapes.

    install()                          # once, before the first server starts
    spawned = watch()                  # in the task that enters stdio_client
    ... async with stdio_client(...) ...
    kill_group(spawned)                # after it exited
"""

from __future__ import annotations

import contextvars
import os
import signal
import sys
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

#: The processes the SDK started in the current task (set by :func:`watch`).
_SPAWNED: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "envace_mcp_spawned", default=None)


def install() -> bool:
    """Wrap the SDK's spawn so :func:`watch` sees the process (once; True when in place)."""
    import mcp.client.stdio as stdio

    spawn = getattr(stdio, "_create_platform_compatible_process", None)
    if spawn is None:
        return False
    if getattr(spawn, "_envace_watched", False):
        return True

    async def watched_spawn(*args: Any, **kwargs: Any) -> Any:
        process = await spawn(*args, **kwargs)
        holder = _SPAWNED.get()
        if holder is not None:
            holder.append(process)
        return process

    watched_spawn._envace_watched = True  # type: ignore[attr-defined]
    stdio._create_platform_compatible_process = watched_spawn  # type: ignore[attr-defined]
    return True


def watch() -> list[Any]:
    """The list the SDK's spawns of the current task (and the tasks it starts) go into."""
    holder: list[Any] = []
    _SPAWNED.set(holder)
    return holder


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a process from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[1]), fields[19]
    except (OSError, IndexError, ValueError):
        return None


def descendants(spawned: list[Any]) -> list[tuple[int, str]]:
    """Every living descendant of the spawned servers as (pid, start time), wherever its
    process group or session (Linux; elsewhere none)."""
    if not os.path.isdir("/proc"):
        return []
    parent: dict[int, int] = {}
    started: dict[int, str] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            parent[int(name)], started[int(name)] = st
    out: list[tuple[int, str]] = []
    todo = [p.pid for p in spawned]
    while todo:
        pid = todo.pop()
        kids = [c for c, pp in parent.items() if pp == pid]
        out.extend((c, started[c]) for c in kids)
        todo.extend(kids)
    return out


def kill_group(spawned: list[Any], also: Sequence[tuple[int, str]] = ()) -> None:
    """SIGKILL what is left of each spawned server's process group, and of ``also`` (from
    :func:`descendants`: each only if its start time still matches) (POSIX; idempotent)."""
    if sys.platform == "win32":  # the SDK's Job Object ends the tree there
        return
    for process in spawned:
        with suppress(ProcessLookupError, PermissionError, OSError):
            os.killpg(process.pid, signal.SIGKILL)
    for pid, start in also:
        st = _stat(pid)
        if st is not None and st[1] == start:
            with suppress(ProcessLookupError, PermissionError, OSError):
                os.kill(pid, signal.SIGKILL)
    spawned.clear()
