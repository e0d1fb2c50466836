"""Turn a Python class with a few tool methods into an envace environment (for plugins).

Mark the tools with :func:`tool`; their signatures (``int``, ``float``, ``str``, ``bool``,
``list``, ``dict``, optional with a default) and docstrings give the schemas. Tasks are plain
data: an initial state, a prompt and ground-truth calls. Arguments are checked against the
signature (unknown, missing and mistyped arguments are error results, never coerced); a tool's
exception is an error result; the state is the instance's public attributes; a tool's READ/WRITE
kind is what was declared, else what was observed (state hash before and after its calls).

    class Counter(MethodEnv):
        name = "counter"
        TASKS = {"to_two": {"state": {"value": 0}, "prompt": "Count to two.",
                            "ground_truth": [["increment", {}], ["increment", {}]]}}

        def setup(self, state):                  # optional: the default sets attributes
            self.value = state.get("value", 0)

        @tool
        def increment(self, by: int = 1) -> dict:
            \"\"\"Add ``by`` to the counter.\"\"\"
            self.value += by
            return {"value": self.value}

Register it in your package's ``pyproject.toml`` (see docs/plugins.md)::

    [project.entry-points."envace.environments"]
    counter = "my_package:Counter"
"""

from __future__ import annotations

import copy
import inspect
import json
import types
import typing
from collections.abc import Callable
from typing import Any

from envace.core.envs.base import ToolKind, ToolResult, hash_state, plain

_JSON_TYPES: dict[Any, tuple[str, tuple[type, ...]]] = {
    int: ("integer", (int,)),
    float: ("number", (int, float)),
    str: ("string", (str,)),
    bool: ("boolean", (bool,)),
    list: ("array", (list,)),
    dict: ("object", (dict,)),
}


def tool(fn: Callable[..., Any] | None = None, *, writes: bool | None = None) -> Any:
    """Mark a method as a tool; ``writes`` declares its kind (else it is observed)."""

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        f.__envace_tool__ = {"writes": writes}  # type: ignore[attr-defined]
        return f

    return mark(fn) if fn is not None else mark


def _json_type(annotation: Any) -> tuple[str | None, tuple[type, ...], bool]:
    """(JSON type, accepted Python types, nullable) of an annotation (None type: anything)."""
    nullable = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(annotation))
        annotation = args[0] if len(args) == 1 else Any
        origin = typing.get_origin(annotation)
    base = origin or annotation
    name, accepted = _JSON_TYPES.get(base, (None, ()))
    return name, accepted, nullable


class MethodEnv:
    """Base class of a method-based environment; see the module docstring."""

    name = "methods"
    TASKS: dict[str, dict[str, Any]] = {}

    @property
    def _kinds_seen(self) -> dict[str, bool]:
        return self.__dict__.setdefault("_seen", {})

    # -- what subclasses may override ------------------------------------------------------
    def setup(self, state: dict[str, Any]) -> None:
        """Load an initial state (default: each key becomes an attribute)."""
        for key, value in state.items():
            setattr(self, key, value)

    # -- catalogue -------------------------------------------------------------------------
    @classmethod
    def _tools(cls) -> dict[str, Callable[..., Any]]:
        return {n: f for n, f in inspect.getmembers(cls, inspect.isfunction)
                if hasattr(f, "__envace_tool__")}

    def task_ids(self) -> list[str]:
        return list(self.TASKS)

    def task_prompt(self, task_id: str) -> str:
        return str(self._task(task_id).get("prompt", ""))

    def ground_truth(self, task_id: str) -> list[tuple[str, dict[str, Any]]]:
        return [(str(n), dict(a)) for n, a in self._task(task_id).get("ground_truth", [])]

    def _task(self, task_id: str) -> dict[str, Any]:
        if task_id not in self.TASKS:
            raise KeyError(f"unknown {self.name} task {task_id!r}; known: "
                           f"{', '.join(self.TASKS) or '(none)'}")
        return self.TASKS[task_id]

    def all_tools(self) -> list[dict[str, Any]]:
        return [self._schema(n, f) for n, f in self._tools().items()]

    @staticmethod
    def _schema(name: str, fn: Callable[..., Any]) -> dict[str, Any]:
        hints = typing.get_type_hints(fn)
        props, required = {}, []
        for p in list(inspect.signature(fn).parameters.values())[1:]:
            jtype, _, _ = _json_type(hints.get(p.name, Any))
            props[p.name] = {"type": jtype} if jtype else {}
            if p.default is inspect.Parameter.empty:
                required.append(p.name)
        doc = inspect.getdoc(fn) or name
        return {"type": "function", "function": {
            "name": name, "description": doc.split("\n\n")[0],
            "parameters": {"type": "object", "properties": props, "required": required}}}

    # -- protocol --------------------------------------------------------------------------
    def reset(self, task: str | dict[str, Any]) -> None:
        """Reset to a task id's state, or to an inline state dict."""
        state = self._task(task).get("state", {}) if isinstance(task, str) else task
        if not isinstance(state, dict):
            raise TypeError(f"a {self.name} state must be a dict, got {type(state).__name__}")
        for key in [k for k in vars(self) if not k.startswith("_")]:
            delattr(self, key)
        self.setup(copy.deepcopy(state))
        self.__dict__["_ready"] = True

    def tools(self) -> list[dict[str, Any]]:
        return self.all_tools()

    def tool_names(self) -> set[str]:
        return set(self._tools())

    def tool_kind(self, tool: str) -> ToolKind | None:
        fn = self._tools().get(tool)
        if fn is None:
            return None
        declared = fn.__envace_tool__["writes"]
        seen = self._kinds_seen.get(tool) if declared is None else declared
        return None if seen is None else (ToolKind.WRITE if seen else ToolKind.READ)

    def execute(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one call; bad calls and a tool's exception are error results."""
        if not self.__dict__.get("_ready"):
            raise RuntimeError("reset() the environment before execute()")
        fn = self._tools().get(tool) if isinstance(tool, str) else None
        if fn is None:
            return ToolResult(f"Error: unknown tool {str(tool)[:100]!r}", True)
        problem = self._check(fn, arguments)
        if problem:
            return ToolResult(f"Error: {tool}: {problem}", True)
        before = self.state_hash()
        try:
            result = fn(self, **copy.deepcopy(arguments))
        except Exception as exc:  # the tool's failure is data
            return ToolResult(f"Error: {type(exc).__name__}: {exc}", True)
        finally:
            changed = self.state_hash() != before
            self._kinds_seen[tool] = self._kinds_seen.get(tool, False) or changed
        text = result if isinstance(result, str) else json.dumps(result, default=str)
        return ToolResult(text, False)

    @staticmethod
    def _check(fn: Callable[..., Any], arguments: Any) -> str | None:
        if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments):
            return "arguments must be an object with string keys"
        params = list(inspect.signature(fn).parameters.values())[1:]
        names = {p.name for p in params}
        unknown = sorted(set(arguments) - names)
        if unknown:
            return f"unexpected argument(s) {', '.join(unknown)}"
        missing = [p.name for p in params
                   if p.default is inspect.Parameter.empty and p.name not in arguments]
        if missing:
            return f"missing argument(s) {', '.join(missing)}"
        hints = typing.get_type_hints(fn)
        for name, value in arguments.items():
            jtype, accepted, nullable = _json_type(hints.get(name, Any))
            if value is None and nullable:
                continue
            bad_bool = isinstance(value, bool) and bool not in accepted
            if jtype and (not isinstance(value, accepted) or bad_bool):
                return f"argument {name} must be {jtype}, got {type(value).__name__}"
        return None

    def state(self) -> dict[str, Any]:
        return {k: plain(v) for k, v in sorted(vars(self).items()) if not k.startswith("_")}

    def state_hash(self) -> str:
        return hash_state(self.state())
