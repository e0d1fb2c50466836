"""``mcp:<profile>`` as a family: its tasks come from the user's task file, not committed splits.

A built-in family's record is a module constant; an MCP family is made per environment name
(:func:`mcp_family`) over the task file of ``--mcp-tasks FILE`` (``ENVACE_MCP_TASKS``). Its
splits are the tasks' own ``split`` fields (``train``, ``dev``, ``test``; ``split_tasks`` also
takes ``all``: every task of the file); a task is its own resampling unit.
``family("mcp:<profile>")`` returns it, so rollout, train, eval and the rewards reach MCP tasks
through the same record as the built-ins.

    fam = mcp_family("mcp:ledger")
    fam.split_tasks("all", "task")            # every task of $ENVACE_MCP_TASKS
"""

from __future__ import annotations

from functools import cache
from typing import Any

from envace.core.envs.family import Family
from envace.core.envs.mcp.env import mcp_env
from envace.core.envs.mcp.export import real_trajectory
from envace.core.envs.mcp.taskfile import SPLITS, tasks_path
from envace.core.envs.mcp.tasks import McpTask, load_tasks
from envace.core.envs.mcp.verify import reward
from envace.core.envs.task_common import UnknownTask


def _tasks(env_name: str) -> list[McpTask]:
    path = tasks_path()
    tasks, problems = load_tasks(path, env_name)
    if problems:
        first = problems[0]
        raise ValueError(f"{len(problems)} bad line(s) in the task file {path}; line "
                         f"{first['line']}: {first['reason']}")
    return tasks


@cache
def mcp_family(env_name: str) -> Family:
    """The family record of ``mcp:<profile>`` (see the module docstring)."""

    def split_tasks(split: str, unit: str = "task") -> list[McpTask]:
        if split not in (*SPLITS, "all"):
            raise ValueError(f"an MCP task split is one of {', '.join(SPLITS)} or all")
        return [t for t in _tasks(env_name) if split == "all" or t.split == split]

    def get_task(task_id: str, version: str | None = None) -> McpTask:
        for t in _tasks(env_name):
            if t.id == task_id:
                return t
        raise UnknownTask(f"no task {task_id!r} in the task file {tasks_path()}")

    def new_env(task: Any = None) -> Any:
        return mcp_env(env_name)

    return Family(
        name=env_name, summary=f"MCP server profile {env_name.removeprefix('mcp:')!r}",
        splits=SPLITS, split_tasks=split_tasks, get_task=get_task, new_env=new_env,
        real_trajectory=real_trajectory, reward=reward, resampling_unit="task",
        cluster_id=lambda task_id: task_id,
    )
