"""BFCL v4 multi-turn as an envace family: 800 tasks (200 scenarios x 4 category variants) over
bfcl-eval's eight backends, split by scenario (140/30/30), the four variants of a scenario one
resampling unit (they share most calls and responses)."""

from __future__ import annotations

from typing import Any

from envace.core.envs.bfcl.env import BFCLEnv, backend_class, backend_methods
from envace.core.envs.bfcl.export import real_trajectory
from envace.core.envs.bfcl.tasks import (
    BACKENDS,
    SPLITS,
    Task,
    function_docs,
    get_task,
    split_tasks,
)
from envace.core.envs.bfcl.turns import resolve, turn_tasks
from envace.core.envs.bfcl.verify import reward
from envace.core.envs.family import Family
from envace.core.envs.units import resampling_unit, scenario_of

#: Per-turn task ids are ``<task id>@t<k>``.
TURN_MARK = "@t"


def _split(split: str, unit: str) -> list[Task]:
    tasks = split_tasks(split)
    return turn_tasks(tasks) if unit == "turn" else tasks


def _task(task_id: str, version: str | None = None) -> Task:
    if version is not None:
        raise ValueError("bfcl has no benchmark versions")
    return resolve(task_id) if TURN_MARK in task_id else get_task(task_id)


def _new_env(task: Any = None) -> BFCLEnv:
    return BFCLEnv()


def _warm() -> None:
    for name in BACKENDS:  # loaded once here, not in every environment child (70 ms each)
        backend_class(name)
        backend_methods(name)
        function_docs()


FAMILY = Family(
    name="bfcl", summary="BFCL v4 multi-turn: 8 stateful backends, 800 tasks",
    splits=SPLITS, split_tasks=_split, get_task=_task, new_env=_new_env,
    real_trajectory=real_trajectory, reward=reward, resampling_unit=resampling_unit("bfcl"),
    cluster_id=scenario_of, warm=_warm,
)
