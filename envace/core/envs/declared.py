"""The resampling unit an environment declares for itself: a plugin's class, an MCP task file.

``envace.core.envs.units`` reads the built-in families' units from task ids alone. A plugin
environment may declare its own (a class attribute ``resampling_unit`` and an optional static
method ``cluster_of(task_id) -> str``), and an MCP task file may give each task a ``cluster``
(tasks sharing one are one unit, ``"cluster"``). The audit reads the declaration here, by the
trajectory's ``env.name``, without constructing the environment (a registered class or the
plugin's entry point, loaded); when the plugin cannot load, or the MCP task file cannot be
read, the unit falls back to the task and ``note`` says why.

    d = declared_unit("counter")     # Declaration(unit="task", source=..., note=None)
    d = declared_unit("mcp:ledger")  # unit "cluster" when $ENVACE_MCP_TASKS gives tasks a cluster
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from envace.core.envs.mcp.taskfile import TaskFileError, tasks_path
from envace.core.envs.units import BUILTIN_UNITS, TASK, UNITS

MCP_CLUSTER = "cluster"  # the unit of an MCP task file whose tasks declare a ``cluster``


@dataclass(frozen=True)
class Declaration:
    """What an environment declares: ``unit`` (None: nothing beyond the task-id rule of
    ``units``), the ``cluster_of`` of a unit of its own, who declared it, and why it fell back
    to the task (``note``; None when it did not)."""

    unit: str | None
    cluster_of: Callable[[str], str] | None
    source: str
    note: str | None = None


def _safe(fn: Callable[[str], object]) -> Callable[[str], str]:
    """``fn`` that never raises: a task id it cannot map is its own cluster (``task:<id>``)."""

    def call(task_id: str) -> str:
        try:
            value = fn(task_id)
        except Exception:  # a plugin's bug costs that task its grouping, never the audit
            return f"task:{task_id}"
        return f"task:{task_id}" if value is None else str(value)

    return call


def _plugin(name: str) -> Declaration:
    # lazy: loads : only this path needs it
    from envace.core.envs.base import _REGISTRY, PluginLoadError, _load_plugin, plugin_entry_points

    factory = _REGISTRY.get(name)
    source = f"environment {name!r} (registered in process)"
    if factory is None:
        ep = plugin_entry_points().get(name)
        if ep is None:
            return Declaration(TASK, None, f"environment {name!r}",
                               f"environment {name!r} is not registered or installed here: "
                               "clustered by the task")
        source = f"plugin {name!r} ({ep.value})"
        try:
            factory = _load_plugin(name, ep)
        except PluginLoadError as exc:
            return Declaration(TASK, None, source, f"{exc}: clustered by the task")
    unit = getattr(factory, "resampling_unit", None)
    if not isinstance(unit, str) or not unit:
        return Declaration(TASK, None, f"{source}, no resampling_unit declared (the task)")
    if unit in BUILTIN_UNITS:
        return Declaration(unit, None, source)
    fn = getattr(factory, "cluster_of", None)
    if not callable(fn):
        return Declaration(TASK, None, source, f"{source} declares the unit {unit!r} without "
                                               "cluster_of(task_id): clustered by the task")
    return Declaration(unit, _safe(fn), source)


def _mcp(name: str) -> Declaration:
    # lazy: loads anyio, jsonschema, mcp: only this path needs it
    from envace.core.envs.mcp.tasks import load_tasks

    try:
        path = tasks_path()
        tasks, _ = load_tasks(path, name)
    except TaskFileError as exc:
        return Declaration(TASK, None, f"MCP environment {name!r}",
                           f"{exc}: the task file's clusters (if any) unread, clustered by the "
                           "task")
    clusters = {t.id: t.cluster for t in tasks if t.cluster is not None}
    source = f"MCP task file {path}"
    if not clusters:
        return Declaration(TASK, None, f"{source}, no task declares a cluster (the task)")
    return Declaration(MCP_CLUSTER, lambda tid: clusters.get(tid, f"task:{tid}"), source)


def declared_unit(env_name: str | None) -> Declaration:
    """The unit environment ``env_name`` declares (see the module docstring); built-in
    families: ``Declaration(None, ...)`` (their unit is read from the task ids)."""
    name = str(env_name or "")
    if not name or name.lower() in UNITS:
        return Declaration(None, None, "the family's task ids")
    if name.startswith("mcp:"):
        return _mcp(name)
    return _plugin(name)
