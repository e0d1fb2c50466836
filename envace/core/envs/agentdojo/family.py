"""AgentDojo as an envace family: four suites of stateful tools, 97 user tasks (v1.2.2), split
by user task; a user task within its suite is the resampling unit (each is one trajectory)."""

from __future__ import annotations

from typing import Any

from envace.core.envs.agentdojo.env import AgentDojoEnv
from envace.core.envs.agentdojo.export import real_trajectory
from envace.core.envs.agentdojo.tasks import DEFAULT_VERSION, SPLITS, AgentDojoTask, get_task
from envace.core.envs.agentdojo.tasks import split_tasks as _split_tasks
from envace.core.envs.agentdojo.verify import reward
from envace.core.envs.family import Family
from envace.core.envs.units import resampling_unit


def _split(split: str, unit: str) -> list[AgentDojoTask]:
    return list(_split_tasks(split))  # a user task is one user turn: unit changes nothing


def _task(task_id: str, version: str | None = None) -> AgentDojoTask:
    return get_task(task_id, version or DEFAULT_VERSION)


def _new_env(task: Any = None) -> AgentDojoEnv:
    return AgentDojoEnv(getattr(task, "version", None) or DEFAULT_VERSION)


FAMILY = Family(
    name="agentdojo", summary="AgentDojo: workspace, travel, banking, slack; 97 user tasks",
    splits=SPLITS, split_tasks=_split, get_task=_task, new_env=_new_env,
    real_trajectory=real_trajectory, reward=reward,
    resampling_unit=resampling_unit("agentdojo"), cluster_id=str,  # a user task is its own unit
)
