"""The environment-family contract: what a family folder provides, and the registry of families.

A *family* is one benchmark's real environments with everything the rest of envace needs to run
on them: the adapter (an :class:`~envace.core.envs.base.Environment`), its tasks and committed
splits, how a task's ground truth becomes a real trajectory, its verifier (the task reward), and
the unit that makes its trajectories statistically independent. Each built-in family is a folder
``envace/core/envs/<family>/`` with the same file names (``env.py``, ``tasks.py``, ``verify.py``,
``family.py``); ``family.py`` holds its :class:`Family` record, ``FAMILY``. The contract in words,
and the tests every family must pass, are in ``envace/core/envs/README.md``.

    fam = family("bfcl")
    tasks = fam.split_tasks("dev", "task")        # the committed dev split
    env = fam.new_env(tasks[0]); env.reset(tasks[0])
    traj = fam.real_trajectory(tasks[0], None, True)
    fam.reward("state", tasks[0], [[...]], "")     # {'reward', 'success', 'detail'}
    fam.cluster_id(tasks[0].id)                    # the resampling unit this task belongs to

Families load lazily (:data:`FAMILIES` names modules, imported on first use): AgentDojo's and
τ²-bench's packages are slow to import, and a missing one must not break the others.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Call = tuple[str, dict[str, Any]]

#: Built-in families and the module holding each one's ``FAMILY``, in listing order.
FAMILIES: dict[str, str] = {
    "bfcl": "envace.core.envs.bfcl.family",
    "agentdojo": "envace.core.envs.agentdojo.family",
    "tau2": "envace.core.envs.tau2.family",
}


@dataclass(frozen=True)
class Family:
    """One environment family: how to build, list, export, verify and resample its tasks."""

    name: str
    """The environment name (``make_env(name)``, a trajectory's ``env.name``)."""
    summary: str
    """One line for ``envace envs`` and the docs."""
    splits: tuple[str, ...]
    """The committed splits (``train``, ``dev``, ``test``, ...)."""
    split_tasks: Callable[[str, str], list[Any]]
    """``(split, unit) -> tasks`` of a committed split; ``unit`` is ``task`` or ``turn``
    (a family whose tasks are one user turn gives the same tasks for both)."""
    get_task: Callable[[str, str | None], Any]
    """``(task_id, version or None) -> task`` (a clear ``UnknownTask`` for an id it does not
    have; ``version`` picks a benchmark version where the family has several, else must be
    None)."""
    new_env: Callable[[Any], Any]
    """``task -> a fresh Environment`` that can be reset to the task (its version, its domain)."""
    real_trajectory: Callable[[Any, Any, bool], Any]
    """``(task, env or None, turn_end) -> Trajectory``: the task's ground truth executed in the
    real environment, recorded with ``source: "real"``."""
    reward: Callable[[str, Any, list[list[Call]], str], dict[str, Any]]
    """``(kind, task, calls_per_turn, final_text) -> {'reward', 'success', 'detail'}``: the
    verifier, which never feeds the policy."""
    resampling_unit: str
    """What makes trajectories independent (``scenario``, ``task``, ...): every interval
    resamples it."""
    cluster_id: Callable[[str], str]
    """``task_id -> the id of its resampling unit`` (BFCL: the scenario of its four variants)."""
    warm: Callable[[], None] | None = None
    """Optional: load, in the process that forks environment children
    (``envace.core.envs.guard``), what each new environment would otherwise load in its own
    child (BFCL: its backend classes), so that a child per episode starts in milliseconds."""


class UnknownFamily(KeyError):
    """A name that is no built-in family (plugins are environments, not families)."""

    def __str__(self) -> str:
        return str(self.args[0])


#: Names with this prefix are MCP server profiles (``envace/core/envs/mcp``): one family each,
#: made from the user's config and task file rather than listed here.
MCP_PREFIX = "mcp:"
#: The module that makes a profile's family (``mcp_family``) and environment (``mcp_env``); named
#: as data like FAMILIES, so the registry never imports its members (no import circle).
MCP_MODULES = {"family": "envace.core.envs.mcp.family", "env": "envace.core.envs.mcp.env",
               "profile": "envace.core.envs.mcp.profile"}


def family(name: str) -> Family:
    """The built-in family called ``name`` (imported on first use), or the family of an MCP
    profile ``mcp:<profile>`` (its tasks from ``--mcp-tasks FILE``)."""
    if name.startswith(MCP_PREFIX):
        return importlib.import_module(MCP_MODULES["family"]).mcp_family(name)
    if name not in FAMILIES:
        raise UnknownFamily(f"{name!r} is not a built-in environment family; families: "
                            f"{', '.join(FAMILIES)}")
    fam = importlib.import_module(FAMILIES[name]).FAMILY
    if not isinstance(fam, Family) or fam.name != name:
        raise TypeError(f"{FAMILIES[name]}.FAMILY is not the Family record of {name!r}")
    return fam


def family_names() -> list[str]:
    """The built-in families, in listing order."""
    return list(FAMILIES)
