"""Any MCP server as an envace environment: ``mcp:<profile>`` (``docs/mcp.md``).

``reset(task)`` makes a fresh working directory, writes the task's state files into it, runs the
profile's setup commands there, and starts a fresh server process (stdio) in it through the real
SDK client: ``initialize``, then ``tools/list`` (schemas in the function format). ``execute`` is
one ``tools/call``: the response text is :func:`content.result_text` of the result, ``isError``
an error result; a call the tool's input schema rejects (an unknown, missing or mistyped
argument) is an error result without reaching the server; a server that crashes, breaks the
protocol or does not answer within the timeout is an error result with the reason, and is
stopped. The state is the workdir's files (:mod:`workdir`); a tool's kind is what the profile
declares, else WRITE once a call was seen to change the state, else READ if the server marks it
read-only or successful calls were seen not to change it, else WRITE (it may change state).

    env = make_env("mcp:git")                     # the profile "git" of $ENVACE_MCP_CONFIG
    env.reset({"files": {"README.md": "hello\\n"}})
    env.execute("git_status", {"repo_path": "."}).content
    env.close()                                   # also at exit and on Ctrl-C

``call_timeout`` (seconds, a keyword of ``make_env``) bounds every request's timeout below the
profile's ``timeout_s``: the hook for the generic per-call limit (``--call-timeout``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import weakref
from pathlib import Path
from typing import Any

from mcp.client.stdio import StdioServerParameters, get_default_environment

from envace.core.envs.base import ToolKind, ToolResult, hash_state
from envace.core.envs.mcp.client import ServerError, ServerProcess
from envace.core.envs.mcp.content import fill_workdir, function_schema, result_text
from envace.core.envs.mcp.profile import Profile, load_profile
from envace.core.envs.mcp.schema_check import SCHEMA_CHECK_S, check_arguments, compile_schema
from envace.core.envs.mcp.taskfile import read_task_file
from envace.core.envs.mcp.workdir import check_files, read_state, write_files
from envace.core.envs.task_common import UnknownTask

#: Tool kinds observed in this process, per profile: tool -> whether a call changed the state.
_OBSERVED: dict[str, dict[str, bool]] = {}


class McpEnv:
    """One MCP server profile as an :class:`~envace.core.envs.base.Environment`."""

    def __init__(self, profile: str | Profile, config: str | None = None,
                 call_timeout: float | None = None, tasks: str | None = None) -> None:
        self.profile = profile if isinstance(profile, Profile) else load_profile(profile, config)
        self.name = self.profile.env_name
        self.call_timeout = call_timeout
        self._server: ServerProcess | None = None
        self._root: Path | None = None
        self._schemas: list[dict[str, Any]] = []
        self._validators: dict[str, Any] = {}
        self._read_only: set[str] = set()
        self._tasks: dict[str, Any] = {}
        if tasks is not None:  # reset by id: a task's state is all the environment needs
            self._tasks = {t["id"]: {"files": t["files"]} for t in read_task_file(tasks)[0]}
        self._held: list[Any] = [None, None]  # (server, root) for the finalizer
        weakref.finalize(self, _cleanup, self._held)

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def workdir(self) -> Path:
        if self._root is None:
            raise RuntimeError("reset() the environment first")
        return self._root / "work"

    def close(self) -> None:
        """Stop the server and remove the working directory (idempotent)."""
        self._server, self._root = None, None
        _cleanup(self._held)

    def __enter__(self) -> McpEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self, task: Any) -> None:
        """A fresh workdir with the task's state files and a fresh server in it. ``task``: a
        task (:class:`~envace.core.envs.mcp.tasks.McpTask`), an inline state
        ``{"files": {...}}`` (a trajectory's ``env.state``) or a task id of ``tasks=FILE``."""
        files = self._task_files(task)
        self.close()
        self._root = Path(tempfile.mkdtemp(prefix=f"envace-mcp-{self.profile.name}-"))
        self._held[1] = self._root
        work = self.workdir
        work.mkdir()
        write_files(work, files)
        self._run_setup(work)
        self._start(work)

    def _task_files(self, task: Any) -> dict[str, str]:
        if isinstance(task, str):
            if task not in self._tasks:
                raise UnknownTask(f"unknown {self.name} task {task!r} (give make_env tasks=FILE "
                                  "to reset by id)")
            task = self._tasks[task]
        state = getattr(task, "state", task)
        if not isinstance(state, dict):
            raise TypeError(f"an {self.name} state must be an object, got {type(state).__name__}")
        unknown = sorted(set(state) - {"files"})
        if unknown:
            raise ValueError(f"an {self.name} state has only 'files', not {', '.join(unknown)}")
        return check_files(state.get("files", {}))

    def _environ(self, work: Path) -> dict[str, str]:
        return get_default_environment() | self.profile.environ(str(work))

    def _run_setup(self, work: Path) -> None:
        for argv in self.profile.setup_commands(str(work)):
            try:
                done = subprocess.run(argv, cwd=work, env=self._environ(work),
                                      capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                      timeout=self.profile.startup_timeout_s, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise ServerError(f"{self.name} setup {argv[0]}: {exc}") from None
            if done.returncode:
                raise ServerError(f"{self.name} setup {' '.join(argv)[:200]} exited "
                                  f"{done.returncode}: {done.stderr.strip()[-300:]}")

    def _start(self, work: Path) -> None:
        command, args = self.profile.argv(str(work))
        params = StdioServerParameters(command=command, args=args, env=self._environ(work),
                                       cwd=str(work))
        self._server = ServerProcess(params, errlog=work.parent / "stderr.log",
                                     startup_timeout=self.profile.startup_timeout_s,
                                     label=f"MCP server {self.profile.name!r}")
        self._held[0] = self._server
        tools = self._server.start()
        self._schemas = [function_schema(t) for t in tools]
        self._validators = {t.name: compile_schema(t.input_schema) for t in tools}
        self._read_only = {t.name for t in tools
                           if t.annotations is not None and t.annotations.read_only_hint}

    # -- protocol --------------------------------------------------------------------------
    def tools(self) -> list[dict[str, Any]]:
        return [dict(s) for s in self._schemas]

    def tool_names(self) -> set[str]:
        return {s["function"]["name"] for s in self._schemas}

    def timeout(self) -> float:
        """The per-request timeout: the profile's, bounded by ``call_timeout`` when given."""
        limit = self.profile.timeout_s
        return min(limit, self.call_timeout) if self.call_timeout else limit

    def execute(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        """One ``tools/call``; every failure is an error result (see the module docstring)."""
        if self._root is None:
            return ToolResult("Error: the environment was not reset to a task", True)
        if not isinstance(tool, str) or tool not in self.tool_names():
            return ToolResult(f"Error: unknown tool {str(tool)[:100]!r}", True)
        problem = self._check(tool, arguments)
        if problem:
            return ToolResult(f"Error: {tool}: {problem}", True)
        if self._server is None or not self._server.alive:
            why = "not running" if self._server is None else "stopped after an earlier failure"
            return ToolResult(f"Error: MCP server {self.profile.name!r} is {why}", True)
        work = str(self.workdir)
        before = self.state_hash()
        try:
            result = self._server.call(tool, fill_workdir(arguments, work), self.timeout())
        except ServerError as exc:  # marked as what it was: cut at the limit, or a dead server
            self._observe(tool, before, failed=True)
            return ToolResult(f"Error: {exc}", True, timeout=exc.kind == "timeout",
                              crashed=exc.kind == "crashed")
        self._observe(tool, before, failed=bool(result.is_error))
        text = result_text(result, work, self.profile.volatile)
        return ToolResult(text, bool(result.is_error))

    def _observe(self, tool: str, before: str, failed: bool) -> None:
        """Record whether a call changed the state; a failed call that changed nothing is no
        evidence that the tool only reads."""
        changed = self.state_hash() != before
        seen = _OBSERVED.setdefault(self.profile.name, {})
        if changed or not failed:
            seen[tool] = seen.get(tool, False) or changed

    def _check(self, tool: str, arguments: Any) -> str | None:
        if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments):
            return "arguments must be an object with string keys"
        schema = next(s["function"]["parameters"] for s in self._schemas
                      if s["function"]["name"] == tool)
        props = schema.get("properties")
        if (isinstance(props, dict) and schema.get("additionalProperties") is not True
                and "patternProperties" not in schema):  # names there: the validator's to judge
            unknown = sorted(set(arguments) - set(props))
            if unknown:
                return f"unexpected argument(s) {', '.join(unknown)}"
        # bounded: a catastrophic pattern or a self-referring schema is this call's error
        return check_arguments(self._validators.get(tool), arguments,
                               min(self.timeout(), SCHEMA_CHECK_S))

    def state(self) -> dict[str, Any]:
        if self._root is None:
            return {"files": {}}
        return read_state(self.workdir, self.profile.state_ignore)

    def state_hash(self) -> str:
        return hash_state(self.state())

    def tool_kind(self, tool: str) -> ToolKind | None:
        if tool in self.profile.writes:
            return ToolKind.WRITE
        if tool in self.profile.reads:
            return ToolKind.READ
        if tool not in self.tool_names():
            return None
        seen = _OBSERVED.get(self.profile.name, {}).get(tool)
        if seen:
            return ToolKind.WRITE
        if tool in self._read_only or seen is False:
            return ToolKind.READ
        return ToolKind.WRITE

    # -- catalogue (with tasks=FILE) -------------------------------------------------------
    def task_ids(self) -> list[str]:
        return list(self._tasks)

    def task_prompt(self, task_id: str) -> str:
        return self._tasks[task_id].prompt

    def ground_truth(self, task_id: str) -> list[tuple[str, dict[str, Any]]]:
        return list(self._tasks[task_id].calls())


def _cleanup(held: list[Any]) -> None:
    server, root = held
    held[0] = held[1] = None
    if server is not None:
        server.close()
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


def mcp_env(name: str, **kwargs: Any) -> McpEnv:
    """``make_env("mcp:<profile>", **kwargs)``: the profile from ``config=`` or the process's
    ``ENVACE_MCP_CONFIG``."""
    return McpEnv(name.removeprefix("mcp:"), config=kwargs.pop("config", None)
                  or os.environ.get("ENVACE_MCP_CONFIG"), **kwargs)


#: The tools of each profile's server, listed once per process (``profile_tools``).
_TOOLS: dict[str, list[dict[str, Any]]] = {}


def profile_tools(task: Any) -> list[dict[str, Any]]:
    """The tools of a task's server (listed once per process and environment name, from the
    first task asked about: an ``McpTask`` of :mod:`envace.core.envs.mcp.tasks`)."""
    if task.env_name not in _TOOLS:
        with mcp_env(task.env_name) as env:
            env.reset(task)
            _TOOLS[task.env_name] = env.tools()
    return [dict(s) for s in _TOOLS[task.env_name]]
