"""The BFCL v4 multi-turn executable backends as an envace environment.

Wraps bfcl-eval's eight stateful backends (GorillaFileSystem, MathAPI, MessageAPI, TwitterAPI,
TicketAPI, TradingBot, TravelAPI, VehicleControlAPI). A call is dispatched by its parsed name and
keyword arguments to a public method of the task's backend instances: nothing is ever evaluated
(bfcl-eval's own executor runs ``eval`` on call strings; this adapter does not). Responses are
serialised exactly as bfcl-eval's ``execute_multi_turn_func_call`` does (str as is, dict through
``json.dumps``, anything else through ``str``; an exception as ``Error during execution: ...``).

    env = BFCLEnv()
    env.reset(get_task("multi_turn_base_0"))
    env.execute("cd", {"folder": "document"}).content   # '{"current_working_directory": ...}'
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import signal
import sys
import threading
from contextlib import contextmanager
from functools import cache, lru_cache
from typing import Any

from envace.core.envs.base import ToolKind, ToolResult, hash_state, plain, register_env
from envace.core.envs.bfcl.tasks import BACKENDS, Task, function_docs, get_task, load_tasks
from envace.core.envs.task_common import DATA_DIR

ERROR_PREFIX = "Error during execution: "
TOOL_KINDS_FILE = DATA_DIR / "bfcl_tool_kinds.json"
_WRITE_WORDS = (
    "add", "book", "buy", "cancel", "cd", "close", "comment", "create", "delete", "echo",
    "edit", "fill", "follow", "lock", "login", "logout", "mkdir", "mv", "cp", "place", "post",
    "purchase", "register", "remove", "resolve", "retweet", "rm", "send", "sell", "set",
    "start", "touch", "unlock", "update", "activate", "press", "release", "authenticate",
    "contact", "invoice", "withdraw", "fund", "notify", "mention", "display", "adjust",
)  # fmt: skip


class ToolTimeout(Exception):
    """A backend call ran past its time limit."""


@cache
def backend_class(name: str) -> type:
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    if name not in BACKENDS:
        raise ValueError(f"unknown BFCL backend {name!r}; known: {', '.join(BACKENDS)}")
    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)


@cache
def backend_methods(name: str) -> dict[str, inspect.Signature]:
    """Public method names of a backend class and their signatures (the tools it offers)."""
    cls = backend_class(name)
    return {
        n: inspect.signature(f)
        for n, f in inspect.getmembers(cls, predicate=inspect.isfunction)
        if not n.startswith("_")
    }


@lru_cache(maxsize=1)
def tool_kinds() -> dict[str, str]:
    """READ/WRITE per tool, observed over the ground-truth calls (``scripts/tool_kinds.py``)."""
    if TOOL_KINDS_FILE.exists():
        return json.loads(TOOL_KINDS_FILE.read_text())
    return {}


def serialize_result(result: Any) -> str:
    """bfcl-eval's serialisation of a backend return value."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def is_error_value(result: Any) -> bool:
    return isinstance(result, dict) and "error" in result


@contextmanager
def _time_limit(seconds: float | None):
    """SIGALRM-based limit (main thread only; elsewhere no limit)."""
    use = bool(seconds) and threading.current_thread() is threading.main_thread()
    if not use:
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        if isinstance(sys.exc_info()[1], KeyboardInterrupt):
            return  # a Ctrl-C that came while C code ran must not be replaced by the timeout
        raise ToolTimeout(f"tool call exceeded {seconds} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@register_env("bfcl")
class BFCLEnv:
    """One BFCL task's backend instances, reset from the task's initial configuration."""

    name = "bfcl"
    executed_total = 0  # calls executed by every instance in this process (instrumentation)

    def __init__(self, timeout_s: float | None = 10.0) -> None:
        self.timeout_s = timeout_s
        self.task: Task | None = None
        self.instances: dict[str, Any] = {}
        self._methods: dict[str, tuple[str, Any]] = {}
        self._allowed: set[str] = set()
        self._tools: list[dict[str, Any]] = []
        self.calls = 0  # real calls executed since reset (instrumentation)

    # -- setup -----------------------------------------------------------------------------
    def reset(self, task: Task | str | dict[str, Any]) -> None:
        """Load initial state from a Task, a task id, or an inline state dict
        ``{"involved_classes": [...], "initial_config": {...}, "long_context": bool,
        "excluded_function": [...]}``."""
        if isinstance(task, str):
            task = get_task(task)
        if isinstance(task, dict):
            task = self._inline_task(task)
        self.task = task
        self.instances = {}
        for cls_name in task.involved_classes:
            instance = backend_class(cls_name)()
            if cls_name != "MathAPI":  # bfcl-eval's STATELESS_CLASSES
                cfg = copy.deepcopy(task.initial_config.get(cls_name, {}))
                instance._load_scenario(cfg, long_context=task.long_context)
            self.instances[cls_name] = instance
        self._methods = {
            m: (c, getattr(self.instances[c], m))
            for c in task.involved_classes
            for m in backend_methods(c)
        }
        self._allowed = set(self._methods) - set(task.excluded_functions)
        self._tools = task.tools()
        for turn in task.prefix:  # a per-turn task: earlier turns' ground truth, done right
            for c in turn:
                self.execute(c.name, self.bind(c.name, list(c.args), c.kwargs))
        self.calls = 0

    @staticmethod
    def _inline_task(state: dict[str, Any]) -> Task:
        classes = state.get("involved_classes")
        if not isinstance(classes, list) or not classes:
            raise ValueError("inline state needs 'involved_classes': a non-empty list")
        for c in classes:
            backend_class(c)  # raises a clear error for an unknown backend
        return Task(
            id=str(state.get("id", "inline")),
            category="long_context" if state.get("long_context") else "base",
            scenario=-1,
            involved_classes=list(classes),
            initial_config=dict(state.get("initial_config") or {}),
            turns=[],
            ground_truth=[],
            excluded_functions=list(state.get("excluded_function") or []),
        )

    # -- catalogue (what `envace envs` lists) -----------------------------------------------
    @staticmethod
    def task_ids() -> list[str]:
        return list(load_tasks())

    @staticmethod
    def all_tools() -> list[dict[str, Any]]:
        """Every BFCL tool schema, sorted by name."""
        schemas = {s["function"]["name"]: s for docs in function_docs().values() for s in docs}
        return [schemas[n] for n in sorted(schemas)]

    # -- protocol --------------------------------------------------------------------------
    def tools(self) -> list[dict[str, Any]]:
        return list(self._tools)

    def tool_names(self) -> set[str]:
        return set(self._allowed)

    def tool_kind(self, tool: str) -> ToolKind | None:
        kind = tool_kinds().get(tool)
        if kind is not None:
            return ToolKind(kind)
        if tool not in self._methods and tool not in _all_methods():
            return None
        return ToolKind.WRITE if tool.split("_")[0] in _WRITE_WORDS else ToolKind.READ

    def bind(self, tool: str, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments for a call written with positional ones (BFCL ground truth)."""
        if not args:
            return dict(kwargs)
        owner = self._methods[tool][0]
        sig = backend_methods(owner)[tool]
        bound = sig.bind_partial(None, *args, **kwargs)  # None stands for self
        out = dict(bound.arguments)
        out.pop(next(iter(sig.parameters)))
        return out

    def execute(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one call. Errors (unknown tool, bad arguments, backend exception) are results."""
        if self.task is None:
            raise RuntimeError("reset() the environment before execute()")
        self.calls += 1
        BFCLEnv.executed_total += 1
        if not isinstance(tool, str) or tool not in self._allowed:
            offered = "excluded from this task" if tool in self._methods else "not offered"
            return ToolResult(f"{ERROR_PREFIX}unknown tool {str(tool)[:100]!r} ({offered})", True)
        if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments):
            return ToolResult(f"{ERROR_PREFIX}arguments must be an object with string keys", True)
        method = self._methods[tool][1]
        try:
            # a copy: backends store argument objects in their state and mutate them later
            arguments = copy.deepcopy(arguments)
            with _time_limit(self.timeout_s):
                result = method(**arguments)
        except ToolTimeout as exc:
            if isinstance(exc.__context__, KeyboardInterrupt):
                raise exc.__context__ from None
            return ToolResult(f"{ERROR_PREFIX}{exc}", True, timeout=True)
        except Exception as exc:  # the backend's failure is data, as in bfcl-eval
            # (a MemoryError under the call's memory limit has no message: name it)
            return ToolResult(f"{ERROR_PREFIX}{str(exc) or type(exc).__name__}", True)
        return ToolResult(serialize_result(result), is_error_value(result))

    def state(self) -> dict[str, Any]:
        return {c: plain(i) for c, i in self.instances.items()}

    def state_hash(self) -> str:
        return hash_state(self.state())


@lru_cache(maxsize=1)
def _all_methods() -> frozenset[str]:
    return frozenset(m for c in BACKENDS for m in backend_methods(c))
