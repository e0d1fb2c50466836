"""Which unit an audit's intervals resample, and each step row's cluster under it.

The unit is the environment family's declaration (``envace.core.envs.units``: BFCL's
scenario, AgentDojo's user task, the task elsewhere), read from the rows' task ids so that a
stored ``steps.jsonl`` is clustered as the audit that wrote it was; ``--cluster-by
trajectory|task|scenario|FIELD`` overrides it (FIELD: a field of the step rows).

    unit = resolve_unit(rows, None)      # "scenario" for BFCL rows
    assign_clusters(rows, unit)          # row["cluster"] = "bfcl:17", ...
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from envace.core.envs.units import BUILTIN_UNITS, cluster_id, infer_unit

CLUSTER = "cluster"  # the key of a compact row's cluster

__all__ = ["CLUSTER", "assign_clusters", "check_unit", "cluster_of", "resolve_unit"]


def check_unit(unit: str) -> str | None:
    """Why ``unit`` cannot be a ``--cluster-by`` value, or None."""
    if not unit or not unit.replace("_", "").isalnum():
        return (f"--cluster-by must be one of {', '.join(BUILTIN_UNITS)} or a step-row field "
                f"name, got {unit!r}")
    return None


def resolve_unit(rows: Iterable[dict[str, Any]], cluster_by: str | None) -> str:
    """``cluster_by`` when given, else the unit the rows' environment family declares."""
    if cluster_by:
        return cluster_by
    return infer_unit(str(r.get("task_id")) for r in rows)


def cluster_of(row: dict[str, Any], unit: str) -> str:
    """A step row's cluster under ``unit``."""
    return cluster_id(str(row.get("task_id")), unit,
                      trajectory_id=str(row.get("trajectory_id")), record=row)


def assign_clusters(rows: Iterable[dict[str, Any]], unit: str) -> int:
    """Set ``row["cluster"]`` on every row (in place); returns how many rows lack a FIELD
    unit's field (each is then its own task's cluster; 0 for the built-in units)."""
    missing = 0
    for r in rows:
        r[CLUSTER] = cluster_of(r, unit)
        if unit not in BUILTIN_UNITS and r.get(unit) is None:
            missing += 1
    return missing
