"""The unit that makes an environment's trajectories independent: what an interval resamples.

Trajectories of one environment are not always independent draws. BFCL multi-turn has 200
scenarios in four category variants (``base``, ``miss_func``, ``miss_param``,
``long_context``) that share most of their calls and responses, so the four trajectories of a
scenario fail together; an interval that resamples trajectories counts them as four
observations and is too narrow. Each family therefore declares its *resampling unit*, and the
audit's intervals resample that unit (a cluster bootstrap: whole clusters drawn with
replacement, every trajectory of a drawn cluster kept):

========================  ===============  ====================================================
family                    unit             cluster of a task id
========================  ===============  ====================================================
``bfcl``                  ``scenario``     ``multi_turn_miss_func_17`` -> ``bfcl:17``
``agentdojo``             ``task``         the user task within its suite, ``workspace/user_task_3``
``tau2`` and others       ``task``         the task id
MCP servers, plugins      ``task``         the task id, unless the environment (or task file) says
========================  ===============  ====================================================

The built-in families' records (``envace/core/envs/<family>/family.py``) take their
``resampling_unit`` and ``cluster_id`` from here, so the audit (which reads stored files) and the
families agree by construction.

A plugin environment (a class given to ``register_env`` or an entry point) may declare its own
unit with an optional class attribute ``resampling_unit`` (a string: ``"task"``, ``"trajectory"``
or a name of its own) and an optional static method ``cluster_of(task_id: str) -> str`` that
maps a task id to its cluster (for a unit of its own; without it the unit falls back to the
task). A task file that carries a field of its own per step can be clustered by that field with
``--cluster-by FIELD`` (``audit``). This module imports nothing of envace: the audit reads the
built-in families' declarations from task ids alone, so stored audits (``steps.jsonl``) are
clustered the same way; a plugin's declaration (and an MCP task file's per-task ``cluster``) is
read by the step rows' ``env_name`` in ``envace.core.envs.declared``.

    resampling_unit("bfcl")                                   # "scenario"
    cluster_id("multi_turn_long_context_17", "scenario")      # "bfcl:17"
    cluster_id("workspace/user_task_3", "task")               # "workspace/user_task_3"
    infer_unit(["multi_turn_base_0", "multi_turn_base_1"])    # "scenario"
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

TRAJECTORY, TASK, SCENARIO = "trajectory", "task", "scenario"
#: The units every family may be clustered by; any other name is a step-row field (FIELD).
BUILTIN_UNITS = (TRAJECTORY, TASK, SCENARIO)

#: The declared unit of each known family (anything else: the task).
UNITS: dict[str, str] = {"bfcl": SCENARIO, "agentdojo": TASK, "tau2": TASK, "mcp": TASK}

# a BFCL task id, or a per-turn task of one (``<id>@t<k>``, envace/core/envs/bfcl/turns.py)
_BFCL = re.compile(r"multi_turn_(?:base|miss_func|miss_param|long_context)_(\d+)(?:@t\d+)?")
_AGENTDOJO = re.compile(r"[A-Za-z0-9_]+/user_task_\d+")


def resampling_unit(env_name: str | None, env: Any = None) -> str:
    """The unit that makes trajectories of environment ``env_name`` independent.

    ``env`` (an environment class or object, optional): its ``resampling_unit`` attribute,
    when it has a non-empty string one, wins over the table. Unknown families: ``"task"``.
    """
    declared = getattr(env, "resampling_unit", None) if env is not None else None
    if isinstance(declared, str) and declared:
        return declared
    return UNITS.get(str(env_name or "").lower(), TASK)


def family_of(task_id: str) -> str | None:
    """``"bfcl"`` or ``"agentdojo"`` when ``task_id`` has that family's form, else None."""
    t = str(task_id)
    if _BFCL.fullmatch(t):
        return "bfcl"
    if _AGENTDOJO.fullmatch(t):
        return "agentdojo"
    return None


def scenario_of(task_id: str) -> str:
    """BFCL's scenario of a task id (``bfcl:<n>``; its four variants share it); any other id is
    its own scenario (a task without variants)."""
    m = _BFCL.fullmatch(str(task_id))
    return f"bfcl:{int(m.group(1))}" if m else str(task_id)


def infer_unit(task_ids: Iterable[str]) -> str:
    """The declared unit of the family every task id belongs to (``"scenario"`` for BFCL ids
    only); a mixture of families, or ids of no known family: ``"task"``."""
    families = {family_of(t) for t in task_ids}
    if len(families) == 1:
        (family,) = families
        if family is not None:
            return resampling_unit(family)
    return TASK


def cluster_id(task_id: str, unit: str, *, trajectory_id: str | None = None,
               record: Mapping[str, Any] | None = None,
               cluster_of: Callable[[str], str] | None = None) -> str:
    """The cluster of one trajectory (or of one of its step rows) under ``unit``.

    ``trajectory``: ``trajectory_id`` (required); ``task``: the task id; ``scenario``: BFCL's
    scenario (:func:`scenario_of`); any other name: ``cluster_of(task_id)`` when the environment
    gives one, else the value of that field of ``record`` (a step row), prefixed with the field
    name; a record without the field is its own task's cluster (``task:<id>``), never merged
    with another's.
    """
    if unit == TRAJECTORY:
        if trajectory_id is None:
            raise ValueError("unit 'trajectory' needs the trajectory id")
        return str(trajectory_id)
    if unit == TASK:
        return str(task_id)
    if unit == SCENARIO:
        return scenario_of(task_id)
    if cluster_of is not None:
        return str(cluster_of(str(task_id)))
    value = None if record is None else record.get(unit)
    if value is None or isinstance(value, (dict, list)):
        return f"task:{task_id}"
    return f"{unit}:{value}"
