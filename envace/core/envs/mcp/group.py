"""A server's process group, ended whole with its session: no forked child outlives it.

The SDK's stdio transport (``mcp.client.stdio``) starts a server in a session of its own
(``start_new_session``: its process group id is its pid), but kills that group only when the
server itself is still running 2 s after its stdin closed. A server that exits at once leaves
the children it forked running, re-parented to init (issue 39: a tool that forks a sleeping
child). :func:`install` makes the transport tell the session which process it started (the
holder of :func:`watch`), and :func:`kill_group` ends whatever is left of that group once the
SDK's shutdown has returned (SIGKILL: the server had its grace, its children have nobody left
to answer). A child that made a session of its own (a daemon's double fork) leaves the group by
design and is not found.

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


def kill_group(spawned: list[Any]) -> None:
    """SIGKILL what is left of each spawned server's process group (POSIX; idempotent)."""
    if sys.platform == "win32":  # the SDK's Job Object ends the tree there
        return
    for process in spawned:
        with suppress(ProcessLookupError, PermissionError, OSError):
            os.killpg(process.pid, signal.SIGKILL)
    spawned.clear()
