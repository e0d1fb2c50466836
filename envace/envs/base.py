"""The environment protocol, tool results, and the registry of environments by name.

An environment is a real, executable, stateful tool backend (tau2-bench style: tools are public
methods, state can be dumped and hashed, tool errors are data). Everything that checks a rehearsed
response against reality goes through this protocol.

    env = make_env("bfcl")
    env.reset(task)                      # a Task, or an inline initial state (dict)
    result = env.execute("cd", {"folder": "document"})
    result.content, result.error         # the real response text, and whether it is a failure
    env.state_hash()                     # changes iff the backend state changed
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable


class ToolKind(StrEnum):
    """Whether a tool writes state (tau2-bench marks tools the same way)."""

    READ = "read"
    WRITE = "write"


@dataclass(frozen=True)
class ToolResult:
    """What the environment returned for one call. Errors are data, never exceptions."""

    content: str
    error: bool = False


@runtime_checkable
class Environment(Protocol):
    """A real, stateful tool backend."""

    name: str

    def reset(self, task: Any) -> None:
        """Load a task's initial state (a Task object, or an inline state dict)."""

    def tools(self) -> list[dict[str, Any]]:
        """The tool schemas offered for the current task (OpenAI/HF function format)."""

    def execute(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one call; unknown tools, bad arguments and backend exceptions give error results."""

    def state(self) -> dict[str, Any]:
        """The backend state as plain JSON-able data."""

    def state_hash(self) -> str:
        """A short hash of :meth:`state`."""

    def tool_kind(self, tool: str) -> ToolKind | None:
        """READ or WRITE for a tool (None when unknown)."""


class UnknownEnvironment(KeyError):
    """Raised by :func:`make_env` for a name that is not registered."""

    def __str__(self) -> str:
        return str(self.args[0])


_REGISTRY: dict[str, Callable[..., Environment]] = {}


def register_env(name: str) -> Callable[[Callable[..., Environment]], Callable[..., Environment]]:
    """Class decorator: make an environment constructible by name."""

    def deco(factory: Callable[..., Environment]) -> Callable[..., Environment]:
        _REGISTRY[name] = factory
        return factory

    return deco


def _load_builtin() -> None:
    from envace.envs import bfcl  # noqa: F401  (registers "bfcl")


def make_env(name: str, **kwargs: Any) -> Environment:
    """A fresh environment by registered name; a clear error for an unknown one."""
    _load_builtin()
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise UnknownEnvironment(f"unknown environment {name!r}; registered: {known}")
    return _REGISTRY[name](**kwargs)


def env_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def plain(value: Any, _seen: set[int] | None = None, _depth: int = 0) -> Any:
    """Convert backend state (nested objects, sets, tuples) to JSON-able data, deterministically.

    Objects become dicts of their public attributes; references back up a tree (``parent``) and
    cycles are cut; sets are sorted.
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if _depth > 64:
        return "<deep>"
    seen = _seen if _seen is not None else set()
    if id(value) in seen:
        return "<cycle>"
    if isinstance(value, dict):
        seen.add(id(value))
        out = {str(k): plain(v, seen, _depth + 1) for k, v in value.items()}
        seen.discard(id(value))
        return out
    if isinstance(value, list | tuple):
        seen.add(id(value))
        out_l = [plain(v, seen, _depth + 1) for v in value]
        seen.discard(id(value))
        return out_l
    if isinstance(value, set | frozenset):
        return sorted((plain(v, seen, _depth + 1) for v in value), key=repr)
    if hasattr(value, "__dict__"):
        seen.add(id(value))
        attrs = {
            k: plain(v, seen, _depth + 1)
            for k, v in vars(value).items()
            if not k.startswith("_") and k != "parent"
        }
        seen.discard(id(value))
        return {"__class__": type(value).__name__, **attrs}
    return repr(value)


def hash_state(state: Any) -> str:
    """A 16-hex-digit hash of JSON-able state (key order does not matter)."""
    text = json.dumps(state, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()
