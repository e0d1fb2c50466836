"""A running MCP server, driven from synchronous code through the real SDK's stdio client.

The SDK (``mcp`` 2.x) is async (anyio). envace's :class:`Environment` protocol is synchronous, so
every server session lives as a task on one background event loop (a daemon thread, started on
first use) and synchronous callers wait on it with a deadline:

    server = ServerProcess(params, errlog=path, startup_timeout=30)
    tools = server.start()                       # spawn, initialize, tools/list
    result = server.call("git_status", {"repo_path": "."}, timeout=30)   # a CallToolResult
    server.close()                               # stdin closed, then SIGTERM/SIGKILL (the SDK's)

Every wait is bounded: a server that does not answer ``initialize`` within the startup timeout, or
a call within its timeout, raises :class:`ServerError` with the reason, and the server is stopped
(its state is unknown after a hung call). A JSON-RPC error answer to a call is
:class:`ServerAnswer`, whatever its code: the server goes on. A call counts as crashed only when
the connection really ended (the transport closed our read stream, or the process exited) and
as timed out only when our own deadline passed: the SDK uses the codes -32000 / -32001 for
those, but a server may answer with them too. The SDK's own shutdown closes stdin, waits, then
kills the process tree; what is left of the server's process group is killed after it
(:mod:`envace.core.envs.mcp.group`: forked children included); :func:`close_all` (run at exit,
also in multiprocessing workers and after Ctrl-C) stops every server this process started, so
none is left behind.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import threading
import weakref
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import CONNECTION_CLOSED

from envace.core.envs.mcp import group, lines
from envace.core.envs.mcp.lines import REFUSED_ANSWER
from envace.core.interrupts import Stopped

# stdout read as bounded lines: an answer too long, not text, or with a lone surrogate is that
# call's own clear error at once, never a timeout (envace/core/envs/mcp/lines.py)
lines.install()
# the server's process group ended whole after the SDK's shutdown (envace/core/envs/mcp/group.py)
group.install()

#: Extra seconds the synchronous side waits beyond a request's own timeout before giving up on
#: the event loop itself (only a stuck loop runs this out).
LOOP_GRACE_S = 10.0
#: The longest a close waits for the SDK's shutdown (stdin close 2 s + SIGTERM 2 s + SIGKILL).
CLOSE_WAIT_S = 15.0
STDERR_TAIL = 400  # characters of the server's stderr quoted in an error

# The SDK logs a server's stray non-JSON-RPC lines with a traceback; without a handler of the
# caller's, Python would print them on stderr. They change no answer: kept quiet here.
logging.getLogger("mcp").addHandler(logging.NullHandler())

_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_live: weakref.WeakSet[ServerProcess] = weakref.WeakSet()


class ServerError(RuntimeError):
    """The server could not start, crashed, broke the protocol or did not answer in time;
    ``kind``: ``"timeout"`` (no answer in time), ``"crashed"`` (its connection ended: the
    process died) or None (anything else)."""

    kind: str | None = None


class ServerAnswer(ServerError):
    """The server answered a call with a JSON-RPC error (it is still running)."""


def _background_loop() -> asyncio.AbstractEventLoop:
    """The process's event loop for MCP sessions (a daemon thread, started once)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="envace-mcp-loop",
                             daemon=True).start()
            _loop = loop
        return _loop


def _tail(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""
    return f"; server stderr: ...{text[-STDERR_TAIL:]}" if text else ""


class ServerProcess:
    """One MCP server process and its client session (see the module docstring)."""

    def __init__(self, params: StdioServerParameters, errlog: Path | None = None,
                 startup_timeout: float = 30.0, label: str = "MCP server") -> None:
        self.params = params
        self.errlog = errlog
        self.startup_timeout = startup_timeout
        self.label = label
        self._session: ClientSession | None = None
        self._read: Any = None  # the transport's read stream: closed once the connection ended
        self._spawned: list[Any] = []
        self._stop: asyncio.Event | None = None
        self._main: concurrent.futures.Future[None] | None = None
        self._dead: str | None = None  # why the server is gone, once it is

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> list[types.Tool]:
        """Spawn the server, ``initialize`` and list its tools (every page)."""
        loop = _background_loop()
        ready: concurrent.futures.Future[list[types.Tool]] = concurrent.futures.Future()
        self._stop = asyncio.Event()  # made here, so a close right after start can set it
        self._main = asyncio.run_coroutine_threadsafe(self._run(ready), loop)
        _live.add(self)
        try:
            return ready.result(timeout=self.startup_timeout + LOOP_GRACE_S)
        except concurrent.futures.TimeoutError:
            self.close()
            raise ServerError(f"{self.label} did not start within {self.startup_timeout:g} s"
                              f"{_tail(self.errlog)}") from None
        except ServerError:
            self.close()
            raise

    async def _run(self, ready: concurrent.futures.Future[list[types.Tool]]) -> None:
        stop = self._stop
        assert stop is not None
        self._spawned = group.watch()
        self._left: list[tuple[int, str]] = []
        try:
            with open(self.errlog or "/dev/null", "w", encoding="utf-8") as err:
                async with stdio_client(self.params, errlog=err) as (read, write), \
                        ClientSession(read, write) as session:
                    with anyio.fail_after(self.startup_timeout):
                        await session.initialize()
                        tools = await self._list_tools(session)
                    self._read = read
                    self._session = session
                    ready.set_result(tools)
                    await stop.wait()
                    # its descendants while it still runs: a child that left its group is found
                    self._left = group.descendants(self._spawned)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller, never lost
            reason = _reason(exc, f"starting {self.label}", self.startup_timeout)
            self._dead = self._dead or reason
            if not ready.done():
                ready.set_exception(ServerError(f"{reason}{_tail(self.errlog)}"))
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise
        finally:
            self._session = None
            group.kill_group(self._spawned, self._left)  # its children too, once the SDK is done

    @staticmethod
    async def _list_tools(session: ClientSession) -> list[types.Tool]:
        tools: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(1000):  # a server that pages forever is cut off, not followed
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    def close(self) -> None:
        """Stop the server (bounded; idempotent)."""
        _live.discard(self)
        main, self._main = self._main, None
        if main is None:
            return
        self._dead = self._dead or "stopped"
        loop = _loop
        if loop is not None and not loop.is_closed() and self._stop is not None:
            loop.call_soon_threadsafe(self._stop.set)
        try:
            main.result(timeout=CLOSE_WAIT_S)
        except Stopped:  # the command is stopping: it still ends, the server with it
            main.cancel()
            raise
        except BaseException:  # noqa: BLE001 - a close reports nothing; the process is gone
            main.cancel()

    @property
    def alive(self) -> bool:
        return self._main is not None and self._session is not None and self._dead is None

    # -- calls -----------------------------------------------------------------------------
    def call(self, name: str, arguments: dict[str, Any], timeout: float) -> types.CallToolResult:
        """One ``tools/call``; :class:`ServerError` when the server cannot answer (it is then
        stopped: after a hang or a crash its state is unknown)."""
        if not self.alive:
            raise ServerError(f"{self.label} is not running ({self._dead or 'not started'})")
        fut = asyncio.run_coroutine_threadsafe(self._call(name, arguments, timeout),
                                               _background_loop())
        kind: str | None = None
        try:
            return fut.result(timeout=timeout + LOOP_GRACE_S)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            reason, kind = f"{self.label} did not answer {name} within {timeout:g} s", "timeout"
        except ServerAnswer:
            raise  # an answer: the server goes on
        except ServerError as exc:
            reason, kind = str(exc), exc.kind
        self._dead = reason
        self.close()
        err = ServerError(f"{reason}{_tail(self.errlog)}")
        err.kind = kind
        raise err

    async def _call(self, name: str, arguments: dict[str, Any], timeout: float
                    ) -> types.CallToolResult:
        session = self._session
        if session is None:
            raise ServerError(f"{self.label} is not running ({self._dead or 'exited'})")
        try:  # our own deadline only: an MCPError is then never the SDK's read timeout
            with anyio.fail_after(timeout):
                return await session.call_tool(name, arguments)
        except MCPError as exc:
            if exc.code == REFUSED_ANSWER:  # refused by envace's reader, not the server's error
                raise ServerAnswer(f"{self.label} on {name}: {exc.message[:300]}") from None
            if exc.code != CONNECTION_CLOSED or not self._connection_ended():
                # the server's own error answer, whatever its code (-32000 and -32001 are
                # generic server errors too): that call's error, the server goes on
                raise ServerAnswer(f"{self.label} answered {name} with JSON-RPC error "
                                   f"{exc.code}: {exc.message[:300]}") from None
            err = ServerError(_reason(exc, f"{self.label} on {name}", timeout))
            err.kind = "crashed"
            raise err from None
        except Exception as exc:
            err = ServerError(_reason(exc, f"{self.label} on {name}", timeout))
            err.kind = "timeout" if isinstance(exc, TimeoutError) else None
            raise err from None

    def _connection_ended(self) -> bool:
        """Whether the transport ended (its stdout closed, its stdin broke: the SDK closes the
        read stream's sending side then) or the server process exited."""
        read = self._read
        try:
            if read is not None and read.statistics().open_send_streams == 0:
                return True
        except Exception:  # noqa: BLE001 - a stream without statistics: ask the process
            pass
        return any(getattr(p, "returncode", None) is not None for p in self._spawned)


def _reason(exc: BaseException, what: str, timeout: float) -> str:
    """One line saying why a request failed."""
    if isinstance(exc, TimeoutError):
        return f"{what}: no answer within {timeout:g} s"
    if isinstance(exc, FileNotFoundError | PermissionError):
        return f"{what}: cannot run the command: {exc}"
    if isinstance(exc, BaseExceptionGroup):
        inner = exc.exceptions[0] if exc.exceptions else exc
        return _reason(inner, what, timeout)
    text = str(exc) or type(exc).__name__
    return f"{what}: {type(exc).__name__}: {text[:300]}"


def close_all() -> None:
    """Stop every server this process started (at exit, in workers too, after Ctrl-C)."""
    for server in list(_live):
        server.close()


atexit.register(close_all)
try:  # multiprocessing workers exit without running atexit handlers: their finalizers do run
    from multiprocessing import util as _mp_util

    _mp_util.Finalize(None, close_all, exitpriority=100)
except Exception:  # noqa: BLE001 - without multiprocessing, atexit covers the main process
    pass
