"""Real trajectories: each task's ground-truth calls executed in its real environment.

    envace data export-real [--env bfcl|agentdojo|NAME] --split dev --out dev.jsonl

Each task becomes one trajectory (``source: "real"``) built by its family
(``envace/core/envs/<family>/export.py``); an installed plugin that lists its tasks
(``task_ids``, ``task_prompt``, ``ground_truth``: the optional protocol methods of
``envace.core.envs.base``) gets one user message, its ground-truth calls and an empty final
assistant message. These files are the SFT data, the audit's determinism check and the source of
the reference world models.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from envace.core.envs.base import Environment, make_env
from envace.core.envs.family import FAMILIES, MCP_PREFIX, family
from envace.core.schema import Message, Trajectory


def run_calls(env: Environment, calls: list[tuple[str, dict[str, Any]]],
              messages: list[dict[str, Any]], step: int) -> int:
    """Execute calls, appending one assistant message and one tool message per call."""
    for name, args in calls:
        call_id = f"c{step}"
        result = env.execute(name, args)
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        tool_msg = {"role": "tool", "tool_call_id": call_id, "name": name,
                    "content": result.content, "rehearsed": False}
        if result.error:
            tool_msg["error"] = True
        messages.append(tool_msg)
        step += 1
    return step


def plugin_trajectory(env: Any, env_name: str, task_id: str, turn_end: bool = True
                      ) -> Trajectory:
    """A listed task's ground truth, for an environment with the optional catalogue methods."""
    env.reset(task_id)
    messages: list[dict[str, Any]] = [{"role": "user", "content": env.task_prompt(task_id)}]
    run_calls(env, env.ground_truth(task_id), messages, 0)
    if turn_end:
        messages.append({"role": "assistant", "content": ""})
    return Trajectory(
        id=f"real-{task_id}", task_id=task_id, env={"name": env_name, "task": task_id},
        source="real", messages=[Message.model_validate(m) for m in messages],
        tools=env.tools(), meta={"category": env_name},
    )


def export_real(tasks: Iterable[Any], turn_end: bool = True) -> Iterator[Trajectory]:
    """Real trajectories of tasks of any built-in family (one environment reused per family
    and version: a reset restores the task's whole initial state)."""
    envs: dict[tuple[str, Any], Any] = {}
    for task in tasks:
        fam = family(task.env_name)
        key = (fam.name, getattr(task, "version", None))
        if key not in envs:
            envs[key] = fam.new_env(task)
        yield fam.real_trajectory(task, envs[key], turn_end)


def export_env(env_name: str, task_ids: Iterable[str], turn_end: bool = True,
               version: str | None = None) -> Iterator[Trajectory]:
    """Real trajectories of tasks named by id, of a built-in family or a plugin that lists its
    tasks; ``version`` picks a benchmark version where the family has several (AgentDojo)."""
    if env_name in FAMILIES or env_name.startswith(MCP_PREFIX):  # an MCP profile is a family
        fam = family(env_name)
        yield from export_real((fam.get_task(tid, version) for tid in task_ids),
                               turn_end=turn_end)
        return
    plugin = make_env(env_name)
    missing = [m for m in ("task_prompt", "ground_truth") if not hasattr(plugin, m)]
    if missing:
        raise ValueError(f"environment {env_name!r} does not list tasks with ground truth "
                         f"(no {', '.join(missing)}): it cannot export real trajectories")
    for tid in task_ids:
        yield plugin_trajectory(plugin, env_name, tid, turn_end=turn_end)

