"""Environments that rollout, train and eval run on: their tasks, and the real backend of a task.

    tasks = env_tasks("agentdojo", "dev")           # AgentDojoTask objects of the dev split
    tasks = env_tasks("bfcl", "dev", unit="turn")   # BFCL per-turn tasks (bfcl/turns.py)
    env = task_environment(tasks[0])                # a fresh backend, reset to the task
    traj_env = env_record(tasks[0])                 # the trajectory's ``env`` (replay's key)

An environment takes part in rollout, train and eval when it has committed task splits and a
verifier (``envace.core.rewards``): ``bfcl`` (BFCL v4 multi-turn) and ``agentdojo`` (its user
tasks, benchmark version v1.2.2). The environment is a property of the task (``task.env_name``):
the rollout engine, the reward and the audit all follow it.

The unit of a task: BFCL tasks are multi-turn, and ``unit="turn"`` makes each user turn a task of
its own (``envace.core.envs.bfcl.turns``). AgentDojo user tasks are a single user turn, so each is
already its own unit: ``turn`` and ``task`` give the same tasks.
"""

from __future__ import annotations

from typing import Any

from envace.core.envs.base import Environment, env_names
from envace.core.envs.family import FAMILIES, MCP_PREFIX, family
from envace.core.envs.guard import GuardedEnv, guarded_env
from envace.core.envs.limits import CallLimits
from envace.core.envs.mcp.taskfile import tasks_path

#: Environments with committed splits and a verifier (what rollout, train and eval need).
TASK_ENVS = tuple(FAMILIES)
UNITS = ("turn", "task")


def check_task_env(name: str) -> None:
    """ValueError (one line, saying what to use instead) unless rollout/train/eval can run on
    ``name``: it must be installed and have task splits with a verifier."""
    if name in TASK_ENVS:
        return
    if name.startswith(MCP_PREFIX):  # an MCP profile: its tasks come from the task file
        # lazy: loads yaml: only this path needs it
        from envace.core.envs.mcp.profile import load_profile

        load_profile(name.removeprefix(MCP_PREFIX))
        tasks_path()
        return
    installed = env_names()
    if name not in installed:
        raise ValueError(f"unknown environment {name!r}; installed: {', '.join(installed)}")
    raise ValueError(f"environment {name!r} is installed but has no task splits with a verifier, "
                     f"which rollout, train and eval need; those that do: {', '.join(TASK_ENVS)} "
                     "(audit its trajectories with envace-audit replay instead)")


def env_tasks(name: str, split: str, unit: str = "task") -> list[Any]:
    """The tasks of a committed split of environment ``name``; ``unit="turn"`` splits BFCL's
    multi-turn tasks into per-turn tasks (AgentDojo's are single-turn: unit changes nothing)."""
    check_task_env(name)
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}, not {unit!r}")
    return list(family(name).split_tasks(split, unit))


def env_kwargs(task: Any) -> dict[str, Any]:
    """``make_env(task.env_name, **env_kwargs(task))`` builds the task's backend (its benchmark
    version where it has one)."""
    version = getattr(task, "version", None)
    return {"version": version} if version else {}


def task_environment(task: Any, limits: CallLimits | None = None) -> Environment:
    """A fresh real backend of the task's environment, reset to the task (a per-turn BFCL task
    replays its earlier turns; an AgentDojo task loads in its own benchmark version).

    Every call (the reset included) runs under ``limits`` (default
    :class:`~envace.core.envs.guard.CallLimits`: the backend lives in a child process that is
    killed past the limit, C code included, ``envace.core.envs.guard``); ``CallLimits(None,
    None)``: the plain backend in this process. Close a guarded one with ``close_env``."""
    limits = limits if limits is not None else CallLimits()
    env = (family(task.env_name).new_env(task) if limits.off
           else guarded_env(task.env_name, limits, **env_kwargs(task)))
    try:
        env.reset(task)
    except BaseException:
        close_env(env)
        raise
    return env


def close_env(env: Any) -> None:
    """End a guarded environment's process (a plain environment is left alone: its ``close``
    may be one of its tools)."""
    if isinstance(env, GuardedEnv):
        env.close()


def env_record(task: Any) -> dict[str, Any]:
    """A trajectory's ``env`` for an episode of ``task``: the environment, the task the replay
    resets to (a per-turn task's base task), and the benchmark version where there is one; a
    task with its own ``env_record()`` (an MCP task: its state inline) gives that."""
    if hasattr(task, "env_record"):
        return task.env_record()
    record: dict[str, Any] = {"name": task.env_name,
                              "task": getattr(task, "base_id", None) or task.id}
    version = getattr(task, "version", None)
    if version:
        record["version"] = version
    return record
