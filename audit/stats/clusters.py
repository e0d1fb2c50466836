"""Which unit an audit's intervals resample, and each step row's cluster under it.

The unit is the environment family's declaration (``envace.core.envs.units``: BFCL's
scenario, AgentDojo's user task, the task elsewhere), read from the rows' task ids so that a
stored ``steps.jsonl`` is clustered as the audit that wrote it was; a plugin environment's own
declaration (its class's ``resampling_unit`` and ``cluster_of``) or an MCP task file's
``cluster`` fields are read by the rows' ``env_name`` (``envace.core.envs.declared``; a plugin
that cannot load falls back to the task, and ``note`` says so); ``--cluster-by
trajectory|task|scenario|FIELD`` overrides it (FIELD: a field of the step rows).

    res = resolve(rows, None)                # Resolved(unit="scenario", ...) for BFCL rows
    assign_clusters(rows, res.unit, res.cluster_of)   # row["cluster"] = "bfcl:17", ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from envace.core.envs.declared import declared_unit
from envace.core.envs.units import BUILTIN_UNITS, TASK, cluster_id, infer_unit

CLUSTER = "cluster"  # the key of a compact row's cluster
ENV_NAME = "env_name"  # the key of a step row's environment name (its trajectory's env.name)

__all__ = ["CLUSTER", "ENV_NAME", "Resolved", "assign_clusters", "check_unit", "cluster_of",
           "resolve", "resolve_unit"]


@dataclass(frozen=True)
class Resolved:
    """The unit the intervals resample, who chose it (``source``), the environment's
    ``cluster_of`` for a unit of its own, and why it fell back to the task (``note``)."""

    unit: str
    source: str
    cluster_of: Callable[[str], str] | None = None
    note: str | None = None


#: Step-row fields that are outcomes or per-call figures, never a grouping of trajectories
#: (clustering by the verdict itself would make every interval meaningless).
NOT_UNITS = frozenset({
    "diverged", "scores", "rehearsed", "actual", "actual_error", "rehearsed_error", "unanswered",
    "unanswered_reason", "malformed", "timeout", "crashed", "novelty", "depth", "step", "arguments",
    "references", "mutates_state", "source_rehearsed", "probe", "history", "tool", "messages",
    "likelihood", "likelihood_skipped", "confidence", "confidence_min",
})


def check_unit(unit: str) -> str | None:
    """Why ``unit`` cannot be a ``--cluster-by`` value, or None."""
    if not unit or not unit.replace("_", "").isalnum() or unit.startswith("_"):
        return (f"--cluster-by must be one of {', '.join(BUILTIN_UNITS)} or a step-row field "
                f"name, got {unit!r}")
    if unit in NOT_UNITS or unit.lower() in BUILTIN_UNITS and unit not in BUILTIN_UNITS:
        return (f"--cluster-by {unit}: an outcome or per-call field (or a misspelt unit) is no "
                f"grouping of trajectories; use one of {', '.join(BUILTIN_UNITS)} or a field "
                "that names a group")
    return None


def resolve(rows: Iterable[dict[str, Any]], cluster_by: str | None) -> Resolved:
    """``cluster_by`` when given; else what the rows' one environment declares (a plugin's
    class, an MCP task file); else the unit their task ids' family declares."""
    rows = list(rows)
    if cluster_by and cluster_by in BUILTIN_UNITS:
        return Resolved(cluster_by, "--cluster-by")
    names = {str(r[ENV_NAME]) for r in rows if r.get(ENV_NAME) is not None}
    d = declared_unit(next(iter(names))) if len(names) == 1 else None
    if cluster_by:  # a unit of the environment's own (a rescore keeps it), else a FIELD
        if d is not None and d.unit == cluster_by and d.cluster_of is not None:
            return Resolved(cluster_by, f"--cluster-by, mapped by {d.source}", d.cluster_of)
        if d is not None and d.note and not any(r.get(cluster_by) is not None for r in rows):
            return Resolved(TASK, f"--cluster-by {cluster_by}", None,
                            f"{d.note} (the unit {cluster_by!r} is no field of the rows)")
        return Resolved(cluster_by, "--cluster-by")
    if d is not None and d.unit is not None:
        return Resolved(d.unit, d.source, d.cluster_of, d.note)
    return Resolved(infer_unit(str(r.get("task_id")) for r in rows), "the family's task ids")


def resolve_unit(rows: Iterable[dict[str, Any]], cluster_by: str | None) -> str:
    """The unit of :func:`resolve`."""
    return resolve(rows, cluster_by).unit


def cluster_of(row: dict[str, Any], unit: str,
               env_cluster_of: Callable[[str], str] | None = None) -> str:
    """A step row's cluster under ``unit`` (``env_cluster_of``: the environment's own map of a
    task id to its cluster, for a unit it declares)."""
    return cluster_id(str(row.get("task_id")), unit,
                      trajectory_id=str(row.get("trajectory_id")), record=row,
                      cluster_of=env_cluster_of)


def assign_clusters(rows: Iterable[dict[str, Any]], unit: str,
                    env_cluster_of: Callable[[str], str] | None = None) -> int:
    """Set ``row["cluster"]`` on every row (in place); returns how many rows lack a FIELD
    unit's field (each is then its own task's cluster; 0 for the built-in units and for a
    unit the environment maps itself)."""
    missing = 0
    for r in rows:
        r[CLUSTER] = cluster_of(r, unit, env_cluster_of)
        if unit not in BUILTIN_UNITS and env_cluster_of is None and r.get(unit) is None:
            missing += 1
    return missing
