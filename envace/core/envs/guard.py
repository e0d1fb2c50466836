"""Every environment call under a wall-clock and a memory limit, C code included.

A CPU-bound call inside a C extension (BFCL's ``square_root(number=2, precision=10**7)`` runs
127 s in ``decimal``) cannot be interrupted inside the process: a signal handler only runs
between bytecodes. So the real environment is hosted in a child process (forked, so it is
built from the same code and registrations as the caller) and every call is forwarded over a
pipe; a call that does not answer within the limit gets its process killed.

    env = guarded_env("bfcl", CallLimits(call_timeout_s=30))
    env.reset("multi_turn_base_0")
    env.execute("square_root", {"number": 2, "precision": 10**7})
    # ToolResult("Error during execution: the call ran past the call limit of 30 s ...",
    #            error=True, timeout=True) after 30 s; the environment is usable again

It is generic: :class:`GuardedEnv` wraps any environment :func:`~envace.core.envs.base.make_env`
can build (built in, registered, plugin) by its name and keyword arguments, and forwards the
protocol (``reset``, ``execute``, ``tools``, ``state``, ``state_hash``, ``tool_kind``) and every
other public method the environment has (``tool_names``, ``reset_record``, ``task_ids``, ...).

After a call is killed (or the process died: a plugin's ``os._exit``, a segfault, the memory
limit), a fresh child is started and brought back to the state before that call by replaying
the reset and the calls since it (environments are deterministic backends; the killed call is
taken to have changed nothing). A call past the limit is answered as an error result marked
``timeout``; a call during which the process died (a signal other than our kill, ``os._exit``,
the memory limit) as one marked ``crashed``, its text naming the signal or exit code. If the
restore fails too, every later call until the next ``reset`` answers an error so marked: the
rest of that trajectory is lost, never more. Memory: ``RLIMIT_AS`` of the child is set to its
size at start plus ``memory_mb`` (Linux and macOS; elsewhere no memory limit), so an allocation
past it fails inside the call (an error result) or kills the child (``crashed``). Ctrl-C in
the caller kills the child and propagates; the child itself ignores SIGINT and dies with its
parent (Linux).

``execute_many`` runs a list of calls in one message and streams each result back, so a
trajectory costs one round trip, not one per call (bench/results/guard_overhead.json).
``send_ahead`` queues later trajectories' batches in the child's pipe, answered in order, each
followed by the kinds of its tools: the child runs them while the audit scores
(``guard_ahead.py``). The child's side of the pipe is ``guard_child.py``.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import os
import select
import time
from collections.abc import Iterator, Sequence
from typing import Any

from envace.core.envs.base import (
    PluginLoadError,
    ToolKind,
    ToolResult,
    load_builtins,
    make_env,
)
from envace.core.envs.family import MCP_PREFIX
from envace.core.envs.guard_ahead import AheadQueue, SentAhead
from envace.core.envs.guard_child import child_main
from envace.core.envs.limits import (
    CallLimits,
    CallTimeout,
    EnvProcessDied,
    exit_text,
)

#: Seconds the child may take to build the environment (imports, loading task data).
STARTUP_TIMEOUT_S = 300.0
ERROR_PREFIX = "Error during execution: "


def guarded_env(name: str, limits: CallLimits | None = None, **kwargs: Any) -> Any:
    """Environment ``name`` with every call under ``limits`` (default :class:`CallLimits`);
    ``limits.off``: the plain environment in this process. An MCP server (``mcp:<profile>``)
    already runs in a process of its own: its requests take the call limit as their timeout (a
    hung server is stopped, envace/core/envs/mcp/), and the memory limit does not apply."""
    limits = limits if limits is not None else CallLimits()
    if limits.off:
        return make_env(name, **kwargs)
    if name.startswith(MCP_PREFIX):  # already out of process: the server's own request timeout
        return make_env(name, **{"call_timeout": limits.call_timeout_s, **kwargs})
    return GuardedEnv(name, kwargs, limits)


# ---------------------------------------------------------------- the parent


class GuardedEnv(AheadQueue):
    """An environment in a child process; see the module docstring."""

    def __init__(self, name: str, kwargs: dict[str, Any] | None = None,
                 limits: CallLimits | None = None) -> None:
        self.name = name
        self.kwargs = dict(kwargs or {})
        self.limits = limits or CallLimits()
        self.restarts = 0  # children killed or died (instrumentation)
        self._proc: Any = None
        self._conn: Any = None
        self._attrs: dict[str, bool] = {}
        #: (the pipe, a ``select.poll`` watching it): :meth:`_ready`
        self._poller: tuple[Any, Any] | None = None
        self._reset_op: tuple[str, Any] | None = None
        self._log: list[tuple[str, Any]] = []  # calls since the last reset
        self._lost: str | None = None
        self._lost_crashed = False  # what lost it: a death (crashed) or the limit (timeout)
        self._kinds: dict[str, ToolKind | None] = {}  # kept across resets: a tool's kind
        self._after_reset: dict[str, Any] = {}
        self._init_queue()
        self._start()

    # -- the child's life ---------------------------------------------------------------------
    def _start(self) -> None:
        load_builtins()  # once per process: every child forks warm (no imports of its own)
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=child_main, args=(theirs, self.name, self.kwargs,
                                                self.limits.memory_mb, os.getpid()),
                           daemon=True, name=f"envace-env-{self.name}")
        proc.start()
        theirs.close()
        self._proc, self._conn = proc, mine
        try:
            if not mine.poll(STARTUP_TIMEOUT_S):
                self._kill()
                raise PluginLoadError(f"environment {self.name!r} did not start within "
                                      f"{STARTUP_TIMEOUT_S:g} s")
            kind, value = mine.recv()
        except EOFError:
            code = self._kill()
            raise PluginLoadError(f"environment {self.name!r} ended its process while loading "
                                  f"({exit_text(code)})") from None
        except BaseException:
            self._kill()
            raise
        if kind == "fail":
            self._kill()
            raise value
        self._attrs = value

    def _kill(self) -> int | None:
        self._drop_queue()
        self._poller = None
        proc, self._proc = self._proc, None
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None
        if proc is None:
            return None
        if proc.is_alive():
            with contextlib.suppress(OSError):
                proc.kill()
        proc.join(5)
        return proc.exitcode

    def close(self) -> None:
        """End the child process (also done when this object is collected)."""
        if self._conn is not None:
            with contextlib.suppress(OSError, BrokenPipeError):
                self._conn.send(("quit",))
        if self._proc is not None:
            self._proc.join(1)
        self._kill()

    def __del__(self, _quiet: Any = contextlib.suppress) -> None:
        # bound at definition: at interpreter exit the module's globals may be gone already.
        # Never blocks (no join): an exception raised in __del__ is printed and dropped, so a
        # Ctrl-C that landed in a 5 s join here was lost and the command ran on (tester B15);
        # the killed child is reaped by multiprocessing's next start or at exit.
        proc, self._proc = self._proc, None
        conn, self._conn = self._conn, None
        with _quiet(Exception):
            if conn is not None:
                conn.close()
            if proc is not None and proc.is_alive():
                proc.kill()

    def _wait(self, timeout: float | None) -> tuple[str, Any]:
        """The next answer, or ("timeout", None) / ("died", exit code); Ctrl-C kills the child."""
        try:
            if not self._ready(timeout):
                self._kill()
                return "timeout", None
            return self._conn.recv()
        except (EOFError, OSError):
            return "died", self._kill()
        except BaseException:  # KeyboardInterrupt: the call is abandoned, the child too
            self._kill()
            raise

    def _ready(self, timeout: float | None) -> bool:
        """``self._conn.poll(timeout)``: whether an answer (or the pipe's end) is there within
        ``timeout`` seconds (None: wait for it), by one ``select.poll`` kept per pipe rather
        than the selector ``poll`` builds per call (issue 44: the audit waits about seven
        times per trajectory). Any event counts, as in ``poll``: a hang-up is read as the end."""
        conn = self._conn
        if not hasattr(select, "poll") or conn is None or conn.closed:
            return conn.poll(timeout)  # not POSIX, or no pipe: as it ever was (it raises)
        if self._poller is None or self._poller[0] is not conn:
            poller = select.poll()
            poller.register(conn.fileno(), select.POLLIN)
            self._poller = (conn, poller)
        ms = None if timeout is None else max(timeout, 0.0) * 1000.0  # poll: milliseconds
        return bool(self._poller[1].poll(ms))

    def _send(self, msg: tuple[Any, ...]) -> bool:
        if self._ahead:  # answers on their way: read them before asking anew
            self._drain()
        if self._stale:  # a batch read early was taken after later ones ran: back to it
            self._stale = False
            self._restart()
        if self._proc is None:
            self._restart()
        try:
            self._conn.send(msg)
            return True
        except (OSError, BrokenPipeError):
            return False

    def _restart(self) -> None:
        """A fresh child in the state before the call that failed (reset + calls since)."""
        self._kill()
        self.restarts += 1
        self._start()
        if self._reset_op is None:
            return
        op, target = self._reset_op
        kind, value = self._ask(("begin", op, target), restore=False)
        if kind != "ok":
            self._lost = f"the environment could not be reset again ({_what(kind, value)})"
            return
        for tool, arguments in self._log:
            kind, value = self._ask(("call", "execute", (tool, arguments), {}), restore=False)
            if kind not in ("ok", "raise"):  # it answered (or raised) the first time too
                self._lost = (f"the environment could not be brought back to its state "
                              f"({tool}: {_what(kind, value)})")
                return

    def _ask(self, msg: tuple[Any, ...], restore: bool = True) -> tuple[str, Any]:
        if not self._send(msg):
            kind, value = "died", self._kill()
        else:
            kind, value = self._wait(self.limits.call_timeout_s)
        if kind in ("timeout", "died") and restore:
            self._restart_quietly()
        return kind, value

    def _restart_quietly(self) -> None:
        try:
            self._restart()
        except Exception as exc:  # it no longer starts: every later call says so
            self._lost = f"the environment could not be restarted: {exc}"

    def _call(self, attr: str, *args: Any, **kw: Any) -> Any:
        kind, value = self._ask(("call", attr, args, kw))
        return self._value(attr, kind, value)

    def _value(self, attr: str, kind: str, value: Any) -> Any:
        if kind == "ok":
            return value
        if kind == "raise":
            raise value
        if kind == "timeout":
            raise CallTimeout(f"{self.name}.{attr} ran past the call limit of "
                              f"{self.limits.call_timeout_s:g} s; its process was killed")
        raise EnvProcessDied(f"{self.name}.{attr}: the environment process died "
                             f"({exit_text(value)})")

    # -- the protocol -------------------------------------------------------------------------
    def reset(self, task: Any) -> None:
        self._begin("reset", task)

    def _begin(self, op: str, target: Any) -> None:
        self._log, self._lost, self._after_reset = [], None, {}
        self._reset_op = None
        self._stale = False  # a reset comes next: no state to bring back
        if self._proc is None:
            self._restart()
        kind, value = self._ask(("begin", op, target))
        self._after_reset = self._value(op, kind, value)
        self._reset_op = (op, target)

    def begin_many(self, op: str, target: Any, calls: Sequence[tuple[str, Any]],
                   track_state: bool = False, tools: Sequence[Any] = ()
                   ) -> Iterator[ToolResult]:
        """``getattr(env, op)(target)`` (``reset`` or ``reset_record``), then
        :meth:`execute_many` of ``calls``, sent as one message: the audit's one round trip
        per trajectory. The reset is answered (or raises, as :meth:`reset` does) before this
        returns; the calls' results are the iterator, each call under the limit as ever. After
        the last call the child sends the kinds of those of ``tools`` not known yet, as they
        stand then, kept for :meth:`tool_kind`."""
        calls = list(calls)
        if self._ahead:
            self._drain()
        self._log, self._lost, self._after_reset = [], None, {}
        self._reset_op = None
        self._stale = False  # a reset comes next: no state to bring back
        if self._proc is None:
            self._restart()
        if not calls or not self._send(("begin_batch", op, target, calls, track_state,
                                        self._kinds_wanted(tools))):
            self._begin(op, target)  # nothing to run, or no child to send to: the plain way
            return self.execute_many(calls, track_state)
        return self._answers(op, target, calls, track_state)

    def _answers(self, op: str, target: Any, calls: list[tuple[str, Any]], track: bool,
                 ahead: SentAhead | None = None) -> Iterator[ToolResult]:
        """The reset's answer (raised if it failed: the calls were not run), then the calls'.
        From here the child's state is this batch's (``ahead``: the one sent ahead it is)."""
        self._log, self._lost, self._after_reset = [], None, {}
        self._reset_op = None
        self._last_read, self._stale = (ahead.seq if ahead is not None else 0), False
        kind, value = self._wait(self.limits.call_timeout_s)
        if kind in ("timeout", "died"):
            self._restart_quietly()
        self._after_reset = self._value(op, kind, value)
        self._reset_op = (op, target)
        return self._many(calls, track, sent=True)

    def _tool_names(self) -> Any:
        """The environment's ``tool_names()`` (sent back with the reset: one round trip)."""
        if "tool_names" in self._after_reset:
            return self._after_reset["tool_names"]
        return self._call("tool_names")

    def execute(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        (result,) = list(self.execute_many([(tool, arguments)]))  # read to its end
        return result

    def execute_many(self, calls: Sequence[tuple[str, Any]], track_state: bool = False
                     ) -> Iterator[ToolResult]:
        """The results of ``calls`` run in order, each under the limit (one message out);
        ``track_state``: each a ``statediff.TrackedResult`` saying how the call changed the
        state (diffed in the environment's process: no state crosses the pipe)."""
        return self._many(list(calls), track_state)

    def _many(self, calls: list[tuple[str, Any]], track: bool, sent: bool = False
              ) -> Iterator[ToolResult]:
        try:
            yield from self._stream(calls, track, sent)
        except GeneratorExit:  # left unread: its answers must not reach a later request
            self._kill()
            raise

    def _stream(self, calls: list[tuple[str, Any]], track: bool = False, sent: bool = False
                ) -> Iterator[ToolResult]:
        """``sent``: the first batch, ``calls`` whole, is on its way already (a ``begin_batch``,
        whose child ends it with the kinds of its tools)."""
        i = 0
        kinds_due = sent
        while i < len(calls):
            if self._lost is not None:
                yield ToolResult(f"{ERROR_PREFIX}not run: {self._lost}", True,
                                 timeout=not self._lost_crashed, crashed=self._lost_crashed)
                i += 1
                continue
            if sent:
                sent = False
            elif not self._send(("batch", calls[i:], track)):
                self._restart_quietly()
                if not self._send(("batch", calls[i:], track)):
                    self._lost = self._lost or "the environment process cannot be reached"
                    self._lost_crashed = True
                    continue
            while i < len(calls):
                t0 = time.monotonic()
                kind, value = self._wait(self.limits.call_timeout_s)
                if kind == "ok":
                    self._log.append(calls[i])
                    i += 1
                    if kinds_due and i == len(calls):
                        self._read_kinds()
                    yield value
                    continue
                if kind == "raise":  # environments answer errors as results; this one raised
                    self._log.append(calls[i])
                    i += 1
                    if kinds_due and i == len(calls):
                        self._read_kinds()
                    yield ToolResult(f"{ERROR_PREFIX}{type(value).__name__}: {value}", True)
                    continue
                took = time.monotonic() - t0
                i += 1
                kinds_due = False  # that child is gone; the rest goes as a plain batch
                self._restart_quietly()
                self._lost_crashed = kind != "timeout"
                if kind == "timeout":
                    yield ToolResult(
                        f"{ERROR_PREFIX}the call ran past the call limit of "
                        f"{self.limits.call_timeout_s:g} s ({took:.1f} s); its process was "
                        f"killed", True, timeout=True)
                else:
                    yield ToolResult(f"{ERROR_PREFIX}the environment process crashed during "
                                     f"this call ({exit_text(value)})", True, crashed=True)
                break  # the rest goes to the new child in a new batch

    def _read_kinds(self) -> None:
        """The kinds a ``begin_batch``'s child sent after its last call; a tool's kind is kept
        across resets, as :meth:`tool_kind` keeps it (the first answer stays)."""
        kind, value = self._wait(self.limits.call_timeout_s)
        if kind == "kinds":
            for tool, tool_kind in value.items():
                self._kinds.setdefault(tool, tool_kind)
        elif kind in ("timeout", "died"):
            self._restart_quietly()

    def tools(self) -> list[dict[str, Any]]:
        return self._call("tools")

    def state(self) -> dict[str, Any]:
        return self._call("state")

    def state_hash(self) -> str:
        return self._call("state_hash")

    def tool_kind(self, tool: str) -> ToolKind | None:
        if tool not in self._kinds:
            self._kinds[tool] = self._call("tool_kind", tool)
        return self._kinds[tool]

    def __getattr__(self, attr: str) -> Any:
        attrs = self.__dict__.get("_attrs") or {}
        if attr.startswith("_") or attr not in attrs:
            raise AttributeError(attr)
        if attr == "reset_record" and attrs[attr]:  # a reset (replayed on a restart)
            return functools.partial(self._begin, attr)
        if attr == "tool_names" and attrs[attr]:
            return self._tool_names
        if attrs[attr]:
            return functools.partial(self._call, attr)
        kind, value = self._ask(("get", attr, (), {}))
        return self._value(attr, kind, value)


def _what(kind: str, value: Any) -> str:
    if kind == "raise":
        return f"{type(value).__name__}: {str(value)[:200]}"
    return "past the call limit" if kind == "timeout" else f"died, {exit_text(value)}"
