"""The environment protocol, tool results, and the registry of environments by name.

An environment is a real, executable, stateful tool backend (tau2-bench style: tools are public
methods, state can be dumped and hashed, tool errors are data). Everything that checks a rehearsed
response against reality goes through this protocol.

    env = make_env("bfcl")
    env.reset(task)                      # a Task, or an inline initial state (dict)
    result = env.execute("cd", {"folder": "document"})
    result.content, result.error         # the real response text, and whether it is a failure
    env.state_hash()                     # changes iff the backend state changed

Built-in environments: the families of ``envace.core.envs.family`` (``bfcl``, ``agentdojo``,
``tau2``; one folder each, their contract in ``envace/core/envs/README.md``). Other packages add
environments through the entry-point group ``envace.environments`` (``name = "module:factory"``,
see docs/plugins.md):
:func:`make_env` finds them through ``importlib.metadata`` and loads one only when it is asked
for, so a plugin that fails to import never breaks the built-ins; asking for it gives a
:class:`PluginLoadError` that names it. A built-in name cannot be taken by a plugin.

A name ``mcp:<profile>`` is a server profile of the user's MCP config (``--mcp-config FILE`` or
``ENVACE_MCP_CONFIG``; ``envace/core/envs/mcp``, docs/mcp.md): resolved before the plugins, so a
plugin cannot take such a name.

Optional methods an environment may have (``envace envs`` and ``export-real`` use them):
``task_ids() -> list[str]``, ``all_tools() -> list[dict]``, ``task_prompt(task_id) -> str``,
``ground_truth(task_id) -> list[tuple[str, dict]]``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol, runtime_checkable

from envace.core.envs.family import FAMILIES, MCP_MODULES, MCP_PREFIX
from envace.core.interrupts import Stopped

ENTRY_POINT_GROUP = "envace.environments"
#: Built-in environments: the families (``envace.core.envs.family``); importing a family's record
#: registers its environment.
BUILTINS = FAMILIES


class ToolKind(StrEnum):
    """Whether a tool writes state (tau2-bench marks tools the same way)."""

    READ = "read"
    WRITE = "write"


@dataclass(frozen=True)
class ToolResult:
    """What the environment returned for one call. Errors are data, never exceptions.
    ``timeout``: the call ran past its time limit and was ended; ``crashed``: its process died
    during the call (a signal, ``os._exit``, the memory limit); ``content`` says which, with the
    signal or exit code. Neither is a response of the environment's own."""

    content: str
    error: bool = False
    timeout: bool = False
    crashed: bool = False


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


class PluginLoadError(UnknownEnvironment):
    """An environment plugin (entry point) that failed to import or to construct."""


_REGISTRY: dict[str, Callable[..., Environment]] = {}


def register_env(name: str) -> Callable[[Callable[..., Environment]], Callable[..., Environment]]:
    """Class decorator: make an environment constructible by name."""

    def deco(factory: Callable[..., Environment]) -> Callable[..., Environment]:
        _REGISTRY[name] = factory
        return factory

    return deco


def _load_builtin() -> None:
    for module in BUILTINS.values():
        importlib.import_module(module)  # registers its name


_WARM: list[bool] = []


def load_builtins() -> None:
    """Import the built-in families and run their ``warm`` (trusted code; a plugin is never
    imported here), once per process. A process that forks environment children
    (``envace.core.envs.guard``) does this first, so each child starts warm instead of
    importing them again (0.6 s a child for BFCL, bench/results/rollout_guard_overhead.json)."""
    if _WARM:
        return
    _load_builtin()
    for module in BUILTINS.values():
        warm = getattr(getattr(importlib.import_module(module), "FAMILY", None), "warm", None)
        if warm is not None:
            with contextlib.suppress(Exception):  # not warmed: each child loads it itself
                warm()
    _WARM.append(True)


def plugin_entry_points() -> dict[str, EntryPoint]:
    """Installed plugins by environment name (first distribution wins; built-in names skipped)."""
    out: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in BUILTINS:
            out.setdefault(ep.name, ep)
    return out


def _distribution(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"


def _load_plugin(name: str, ep: EntryPoint) -> Callable[..., Environment]:
    try:
        factory = ep.load()
    except Stopped:  # the command was told to stop while the plugin loaded: not its failure
        raise
    except BaseException as exc:  # noqa: BLE001 (a plugin's sys.exit or KeyboardInterrupt on
        # import is the plugin's failure, reported, never the command's exit)
        raise PluginLoadError(
            f"environment plugin {name!r} ({ep.value}, from {_distribution(ep)}) failed to "
            f"import: {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(factory):
        raise PluginLoadError(f"environment plugin {name!r} ({ep.value}) is not callable")
    return factory


def make_env(name: str, **kwargs: Any) -> Environment:
    """A fresh environment by name (built in, registered, or an installed plugin); a clear error
    for an unknown name or a plugin that fails to load."""
    _load_builtin()
    if name in _REGISTRY:
        return _REGISTRY[name](**kwargs)
    if name.startswith(MCP_PREFIX):  # a server profile of the user's MCP config (docs/mcp.md)
        return _make_mcp(name, kwargs)
    plugins = plugin_entry_points()
    if name not in plugins:
        known = ", ".join([*BUILTINS, *sorted(set(_REGISTRY) - set(BUILTINS)), *plugins])
        raise UnknownEnvironment(f"unknown environment {name!r}; registered: {known or '(none)'}")
    factory = _load_plugin(name, plugins[name])
    try:
        return factory(**kwargs)
    except Stopped:
        raise
    except BaseException as exc:  # noqa: BLE001 (as on import)
        raise PluginLoadError(f"environment plugin {name!r} ({plugins[name].value}) failed to "
                              f"construct: {type(exc).__name__}: {exc}") from exc


def _make_mcp(name: str, kwargs: dict[str, Any]) -> Environment:
    env_module = importlib.import_module(MCP_MODULES["env"])  # named as data: see family.py
    profile_error = importlib.import_module(MCP_MODULES["profile"]).ProfileError
    try:
        return env_module.mcp_env(name, **kwargs)
    except profile_error as exc:  # no config, no such profile, a malformed one: a clear KeyError
        raise UnknownEnvironment(str(exc)) from None


def env_names() -> list[str]:
    """Built-in, registered and installed plugin environment names (plugins not imported)."""
    _load_builtin()
    rest = sorted((set(_REGISTRY) | set(plugin_entry_points())) - set(BUILTINS))
    return [*BUILTINS, *rest]


def env_source(name: str) -> str:
    """Where an environment comes from: ``built in``, ``plugin <dist> (<module:attr>)``, ..."""
    if name in BUILTINS:
        return "built in"
    if name.startswith(MCP_PREFIX):
        import os

        return f"MCP profile of {os.environ.get('ENVACE_MCP_CONFIG') or '(no --mcp-config)'}"
    ep = plugin_entry_points().get(name)
    if ep is not None:
        return f"plugin {_distribution(ep)} ({ep.value})"
    return "registered in process"


def describe_env(name: str) -> dict[str, Any]:
    """What ``envace envs`` shows: source, task ids and tool names (None where the environment
    cannot list them), or the error that loading it gave."""
    out: dict[str, Any] = {"name": name, "source": env_source(name), "tasks": None,
                           "tools": None, "error": None}
    try:
        env = make_env(name)
        if hasattr(env, "task_ids"):
            out["tasks"] = list(env.task_ids())
        if hasattr(env, "all_tools"):
            out["tools"] = [s["function"]["name"] for s in env.all_tools()]
    except Exception as exc:  # a broken plugin is reported, never fatal to the listing
        out["error"] = str(exc) if isinstance(exc, UnknownEnvironment) else (
            f"{type(exc).__name__}: {exc}")
    return out


#: the types ``plain`` returns as they are (exact types: a subclass, such as an IntEnum, takes
#: the general path, which returns it as it is too)
_ATOMS = frozenset({type(None), bool, int, float, str})


def plain(value: Any, _seen: set[int] | None = None, _depth: int = 0) -> Any:
    """Convert backend state (nested objects, sets, tuples) to JSON-able data, deterministically.

    Objects become dicts of their public attributes; references back up a tree (``parent``) and
    cycles are cut; sets are sorted. Leaves of the common types are taken in place, without a
    call each: the state tracker reads the state around every call of an audit.
    """
    if type(value) in _ATOMS or isinstance(value, bool | int | float | str):
        return value
    if _depth > 64:
        return "<deep>"
    seen = _seen if _seen is not None else set()
    if id(value) in seen:
        return "<cycle>"
    d = _depth + 1
    if isinstance(value, dict):
        seen.add(id(value))
        out = {str(k): v if type(v) in _ATOMS else plain(v, seen, d) for k, v in value.items()}
        seen.discard(id(value))
        return out
    if isinstance(value, list | tuple):
        seen.add(id(value))
        out_l = [v if type(v) in _ATOMS else plain(v, seen, d) for v in value]
        seen.discard(id(value))
        return out_l
    if isinstance(value, set | frozenset):
        return sorted((plain(v, seen, d) for v in value), key=repr)
    if hasattr(value, "__dict__"):
        seen.add(id(value))
        attrs = {
            k: v if type(v) in _ATOMS else plain(v, seen, d)
            for k, v in vars(value).items()
            if not k.startswith("_") and k != "parent"
        }
        seen.discard(id(value))
        return {"__class__": type(value).__name__, **attrs}
    return repr(value)


def hash_state(state: Any) -> str:
    """A 16-hex-digit hash of JSON-able state (key order does not matter)."""
    text = json.dumps(state, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
