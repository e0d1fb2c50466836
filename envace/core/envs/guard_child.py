"""The environment's side of the call limits (`envace.core.envs.guard`): the child process.

A forked child builds the environment by name (``make_env``), says which public attributes it
has, then answers the parent's messages over a pipe: ``batch`` (calls whose results stream back
one by one, with the state change of each when tracked), ``begin`` (a reset, answered with the
tool names it enables), ``call`` / ``get`` (any other public method or attribute) and ``quit``.
It ignores Ctrl-C (the parent's to handle), dies with its parent (Linux ``PR_SET_PDEATHSIG``) and
limits its own address space (``RLIMIT_AS``) to its size at start plus the memory limit. Every
exception crosses the pipe as a value (one that does not pickle as its text). The parent's side,
the limits and the restarts are in ``guard.py``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
from collections.abc import Sequence
from typing import Any

from envace.core.envs.base import PluginLoadError, ToolKind, make_env
from envace.core.envs.statediff import StateTracker

#: protocol methods that change no state (a tracked batch after them still knows the state)
_READS_NOTHING = frozenset({"tools", "tool_kind", "tool_names", "state", "state_hash"})


def child_setup(memory_mb: int | None, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)
    if memory_mb is not None:
        with contextlib.suppress(ImportError, OSError, ValueError):
            import resource

            limit = _address_space() + memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _address_space() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError with its text."""
    if not isinstance(exc, Exception):  # SystemExit, KeyboardInterrupt from inside a call
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def child_main(conn: Any, name: str, kwargs: dict[str, Any], memory_mb: int | None,
           parent: int) -> None:
    child_setup(memory_mb, parent)
    try:
        env = make_env(name, **kwargs)
    except BaseException as exc:  # a plugin that exits or raises KeyboardInterrupt on import
        if not isinstance(exc, KeyError | PluginLoadError):
            exc = PluginLoadError(f"environment {name!r} failed to load: "
                                  f"{type(exc).__name__}: {exc}")
        conn.send(("fail", portable(exc)))
        return
    attrs = {a: callable(getattr(env, a, None)) for a in dir(env) if not a.startswith("_")}
    conn.send(("ready", attrs))
    tracker = StateTracker(env)  # a batch with track_state: each result says how state changed
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        op = msg[0]
        if op == "quit":
            return
        if op == "batch":
            _batch(conn, env, tracker, msg[1], len(msg) > 2 and msg[2])
            continue
        if op == "begin_batch":  # a reset and the calls after it: one message, no round trip
            tracker.forget()
            if _answer(conn, _begin, (env, msg[1], msg[2]), {}):
                _batch(conn, env, tracker, msg[3], msg[4])
                conn.send(("kinds", _kinds(env, msg[5] if len(msg) > 5 else ())))
            continue
        if op == "begin" or (op == "call" and msg[1] not in _READS_NOTHING):
            tracker.forget()  # the state may have changed outside a tracked batch
        if op == "begin":  # a reset, answered with what is asked right after one
            _answer(conn, _begin, (env, msg[1], msg[2]), {})
            continue
        _, attr, args, kw = msg
        if op == "get":
            _answer(conn, lambda a=attr: getattr(env, a), (), {})
        else:
            _answer(conn, getattr(env, attr), args, kw)


def _batch(conn: Any, env: Any, tracker: StateTracker, calls: Sequence[tuple[str, Any]],
           track: bool) -> None:
    """Answer each call in order (``track``: with how it changed the state)."""
    if not track:
        tracker.forget()
    for tool, arguments in calls:
        _answer(conn, tracker.execute if track else env.execute, (tool, arguments), {})


def _kinds(env: Any, tools: Sequence[Any]) -> dict[Any, ToolKind | None]:
    """The kinds of ``tools`` (those of the batch's trajectory the parent does not know yet) as
    the environment knows them after the batch ran (what the audit asks next: asked then, with
    later batches waiting in the pipe, it would read all their answers first). A tool whose
    ``tool_kind`` raises or answers what is not a kind (nor None) is left out: asked the plain
    way, that reports it."""
    kinds: dict[Any, ToolKind | None] = {}
    if not callable(getattr(env, "tool_kind", None)):
        return kinds
    for tool in tools:
        try:
            if tool in kinds:
                continue
            kind = env.tool_kind(tool)
        except Exception:  # noqa: BLE001 - unhashable, or the environment's own error
            continue
        if kind is None or isinstance(kind, ToolKind):
            kinds[tool] = kind
    return kinds


def _begin(env: Any, op: str, target: Any) -> dict[str, Any]:
    getattr(env, op)(target)
    return {"tool_names": env.tool_names()} if callable(getattr(env, "tool_names", None)) else {}


def _answer(conn: Any, fn: Any, args: Sequence[Any], kw: dict[str, Any]) -> bool:
    """Send what ``fn`` returns (True) or raises (False)."""
    try:
        value = fn(*args, **kw)
    except BaseException as exc:
        conn.send(("raise", portable(exc)))
        return False
    try:
        conn.send(("ok", value))
    except Exception as exc:  # the value does not pickle
        conn.send(("raise", RuntimeError(f"result not transferable: {type(exc).__name__}: "
                                         f"{exc}")))
        return False
    return True


def run_once(conn: Any, fn: Any, args: Sequence[Any], memory_mb: int | None,
              parent: int) -> None:
    child_setup(memory_mb, parent)
    _answer(conn, fn, args, {})
