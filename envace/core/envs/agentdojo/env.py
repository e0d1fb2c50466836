"""AgentDojo's four tool suites as an envace environment (``make_env("agentdojo")``).

A call is dispatched by name through agentdojo's own ``FunctionsRuntime.run_function`` (a lookup
by name and pydantic validation; nothing is evaluated). The response text is agentdojo's own
``tool_result_to_str`` of the return value (YAML for models and lists, ``str`` otherwise). What
agentdojo's pipeline would show a model as an error is returned as an error result with that
text: ``Invalid tool X provided.`` for an unknown tool, ``ValidationError: ...`` for bad
arguments, ``ValueError: ...`` and the like when a tool raises. Two checks are added, because
agentdojo silently ignores unknown argument names: an argument the tool does not declare is an
error result. As agentdojo's ``ToolsExecutor`` does, a string argument that reads as a Python
list literal is parsed to a list first (:func:`ast.literal_eval`, literals only).

Every call runs inside :func:`~envace.core.envs.agentdojo.tasks.deterministic_world` (a frozen clock
at 2024-05-15 12:00:00, stable participant order), so a task's trajectory is the same in every
run and process. The state is the suite environment's ``model_dump(mode="json")``.

    env = make_env("agentdojo")                     # or AgentDojoEnv(version="v1.2.2")
    env.reset("workspace/user_task_0")
    env.execute("search_calendar_events", {"query": "Networking event", "date": "2024-05-26"})
"""

from __future__ import annotations

import ast
import contextlib
import copy
import json
from functools import cache
from typing import Any

from envace.core.envs.agentdojo.tasks import (
    DEFAULT_VERSION,
    SUITES,
    AgentDojoTask,
    default_environment,
    deterministic_world,
    get_task,
    load_tasks,
    suite_tools,
    suites,
)
from envace.core.envs.base import ToolKind, ToolResult, hash_state, register_env
from envace.core.envs.task_common import DATA_DIR

TOOL_KINDS_FILE = DATA_DIR / "agentdojo_tool_kinds.json"
EMPTY_NAME_ERROR = "Empty function name provided. Provide a valid function name."


@cache
def tool_kinds() -> dict[str, dict[str, str]]:
    """READ/WRITE per suite and tool, observed (``scripts/agentdojo_tool_kinds.py``)."""
    if TOOL_KINDS_FILE.exists():
        return json.loads(TOOL_KINDS_FILE.read_text())
    return {}


def _tool_result_to_str(result: Any) -> str:
    from agentdojo.agent_pipeline.tool_execution import tool_result_to_str

    return tool_result_to_str(result)


def _is_string_list(value: Any) -> bool:
    """agentdojo's ``is_string_list`` (a Python list literal), never raising."""
    if not isinstance(value, str):
        return False
    try:
        return isinstance(ast.literal_eval(value), list)
    except Exception:  # SyntaxError, ValueError, RecursionError, MemoryError
        return False


@register_env("agentdojo")
class AgentDojoEnv:
    """One AgentDojo suite environment, reset from a user task (or an inline state)."""

    name = "agentdojo"

    def __init__(self, version: str = DEFAULT_VERSION) -> None:
        self.version = version
        self.version_loaded = version
        self.task: AgentDojoTask | None = None
        self.suite: str | None = None
        self.environment: Any = None  # agentdojo's TaskEnvironment (a pydantic model)
        self.pre_environment: Any = None  # its copy at reset (what checkers compare against)
        self.trace: list[Any] = []  # agentdojo FunctionCalls executed since reset
        self._runtime: Any = None
        self._params: dict[str, set[str]] = {}
        self.calls = 0

    # -- setup -----------------------------------------------------------------------------
    def reset(self, task: AgentDojoTask | str | dict[str, Any]) -> None:
        """Load a task's initial state: an AgentDojoTask, a task id (this env's version), or a
        dict: ``{"task": id, "version": v}`` or an inline state ``{"suite": s, "version": v,
        "environment": <model_dump(mode="json")>}``."""
        if isinstance(task, dict):
            if "task" in task:
                task = get_task(task["task"], str(task.get("version") or self.version))
            else:
                self._reset_inline(task)
                return
        if isinstance(task, str):
            task = get_task(task, self.version)
        if not isinstance(task, AgentDojoTask):
            raise TypeError(f"cannot reset agentdojo from {type(task).__name__}")
        with deterministic_world():
            env = task.user_task().init_environment(default_environment(task.version, task.suite))
        self._load(task.version, task.suite, env)
        self.task = task

    def reset_record(self, record: dict[str, Any]) -> None:
        """Reset from a trajectory's ``env`` record (``task`` and ``version``, or ``state``)."""
        if "task" in record:
            self.reset({"task": record["task"], "version": record.get("version")})
        else:
            self.reset(record["state"])

    def _reset_inline(self, state: dict[str, Any]) -> None:
        suite = state.get("suite")
        if suite not in SUITES:
            raise ValueError(f"inline state needs 'suite': one of {', '.join(SUITES)}")
        version = str(state.get("version") or self.version)
        env_type = suites(version)[suite].environment_type
        if "environment" in state:
            env = env_type.model_validate(state["environment"])
        else:
            env = default_environment(version, suite)
        self._load(version, suite, env)
        self.task = None

    def _load(self, version: str, suite: str, env: Any) -> None:
        from agentdojo.functions_runtime import FunctionsRuntime

        tools = suites(version)[suite].tools
        self.version_loaded = version
        self.suite = suite
        self.environment = env
        self.pre_environment = env.model_copy(deep=True)
        self._runtime = FunctionsRuntime(tools)
        self._params = {f.name: set(f.parameters.model_fields) for f in tools}
        self.trace = []
        self.calls = 0

    # -- catalogue (optional protocol methods: `envace envs`, export) ------------------------
    def task_ids(self) -> list[str]:
        return list(load_tasks(self.version))

    def all_tools(self) -> list[dict[str, Any]]:
        return [s for suite in SUITES for s in suite_tools(suite, self.version)]

    def task_prompt(self, task_id: str) -> str:
        return get_task(task_id, self.version).prompt

    def ground_truth(self, task_id: str) -> list[tuple[str, dict[str, Any]]]:
        return get_task(task_id, self.version).calls()

    # -- protocol --------------------------------------------------------------------------
    def tools(self) -> list[dict[str, Any]]:
        if self.suite is None:
            return []
        return suite_tools(self.suite, self.version_loaded)

    def tool_names(self) -> set[str]:
        return set(self._params)

    def tool_kind(self, tool: str) -> ToolKind | None:
        kinds = tool_kinds()
        if self.suite is not None:
            kind = kinds.get(self.suite, {}).get(tool)
        else:
            found = {k[tool] for k in kinds.values() if tool in k}
            kind = found.pop() if len(found) == 1 else None
        return ToolKind(kind) if kind else None

    def execute(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one call; unknown tools, bad arguments and a tool's exception are error results."""
        if self._runtime is None:
            raise RuntimeError("reset() the environment before execute()")
        from agentdojo.functions_runtime import FunctionCall

        self.calls += 1
        known = isinstance(tool, str) and tool in self._params
        plain_args = isinstance(arguments, dict) and all(isinstance(k, str) for k in arguments)
        args = copy.deepcopy(arguments) if plain_args else {}
        if known:  # agentdojo's ToolsExecutor: "['a', 'b']" -> ['a', 'b']
            for k, v in args.items():
                if _is_string_list(v):
                    args[k] = ast.literal_eval(v)
        if isinstance(tool, str) and plain_args:  # what agentdojo's checkers see as the trace
            with contextlib.suppress(Exception):  # a value FunctionCall does not accept
                self.trace.append(FunctionCall(function=tool, args=copy.deepcopy(args)))
        if tool == "":
            return ToolResult(EMPTY_NAME_ERROR, True)
        if not known:
            return ToolResult(f"Invalid tool {str(tool)[:100]} provided.", True)
        if not plain_args:
            return ToolResult("ValidationError: arguments must be an object with string keys", True)
        unknown = sorted(set(args) - self._params[tool])
        if unknown:
            takes = ", ".join(sorted(self._params[tool])) or "no arguments"
            return ToolResult(f"ValidationError: unexpected argument(s) {', '.join(unknown)} "
                              f"for {tool}; it takes: {takes}", True)
        try:
            with deterministic_world():
                result, error = self._runtime.run_function(self.environment, tool, args)
                if error is not None:
                    return ToolResult(str(error), True)
                return ToolResult(_tool_result_to_str(result), False)
        except Exception as exc:  # a failure is data
            return ToolResult(f"{type(exc).__name__}: {exc}", True)

    def state(self) -> dict[str, Any]:
        if self.environment is None:
            return {}
        return self.environment.model_dump(mode="json")

    def state_hash(self) -> str:
        return hash_state(self.state())
