"""Real trajectories: each task's ground-truth calls executed in its real environment.

    envace data export-real [--env bfcl|agentdojo|NAME] --split dev --out dev.jsonl

Each task becomes one trajectory (``source: "real"``) built by its family
(``envace/core/envs/<family>/export.py``); an installed plugin that lists its tasks
(``task_ids``, ``task_prompt``, ``ground_truth``: the optional protocol methods of
``envace.core.envs.base``) gets one user message, its ground-truth calls and an empty final
assistant message. These files are the SFT data, the audit's determinism check and the source of
the reference world models.

With ``limits`` (the CLI's ``--call-timeout``; ``envace.core.envs.guard``) the environment runs
in a child process and every call is under the limit; a task whose call runs past it, or (a
plugin) whose reset or calls raise, is not written but named in ``skipped`` (task id, reason):
it costs that task, and the CLI exits 3. So does a call whose arguments or real response pass
the size limit of a call (``MAX_CALL_BYTES``, the limit the audit's readers apply: docs/audit.md,
"Size limits"); a trajectory whose line would pass ``MAX_LINE_BYTES`` is not written and costs
that task too (the CLI's writer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from envace.core.envs.base import make_env
from envace.core.envs.family import FAMILIES, MCP_PREFIX, family
from envace.core.envs.guard import guarded_env
from envace.core.envs.limits import CallLimits, CallTimeout, EnvProcessDied
from envace.core.envs.recording import ExportSkip, real_record, single_turn_messages
from envace.core.schema import Trajectory


def plugin_trajectory(env: Any, env_name: str, task_id: str, turn_end: bool = True
                      ) -> Trajectory:
    """A listed task's ground truth, for an environment with the optional catalogue methods."""
    env.reset(task_id)
    messages = single_turn_messages(env, [{"role": "user", "content": env.task_prompt(task_id)}],
                                    env.ground_truth(task_id), "", turn_end)
    return real_record(task_id, {"name": env_name, "task": task_id}, messages, env.tools(),
                       {"category": env_name})


def export_real(tasks: Iterable[Any], turn_end: bool = True, limits: CallLimits | None = None,
                skipped: list[tuple[str, str]] | None = None) -> Iterator[Trajectory]:
    """Real trajectories of tasks of any built-in family (one environment reused per family
    and version: a reset restores the task's whole initial state); ``limits``/``skipped``: see
    the module docstring (without ``skipped`` a failure raises)."""
    envs: dict[tuple[str, Any], Any] = {}
    for task in tasks:
        fam = family(task.env_name)
        version = getattr(task, "version", None)
        key = (fam.name, version)
        if key not in envs:
            envs[key] = fam.new_env(task) if limits is None else guarded_env(
                task.env_name, limits, **({"version": version} if version else {}))
        yield from _kept(task.id, skipped, (CallTimeout, EnvProcessDied),
                         lambda t=task, e=envs[key], f=fam: f.real_trajectory(t, e, turn_end))


def export_env(env_name: str, task_ids: Iterable[str], turn_end: bool = True,
               version: str | None = None, limits: CallLimits | None = None,
               skipped: list[tuple[str, str]] | None = None) -> Iterator[Trajectory]:
    """Real trajectories of tasks named by id, of a built-in family or a plugin that lists its
    tasks; ``version`` picks a benchmark version where the family has several (AgentDojo)."""
    if env_name in FAMILIES or env_name.startswith(MCP_PREFIX):  # an MCP profile is a family
        fam = family(env_name)
        yield from export_real((fam.get_task(tid, version) for tid in task_ids),
                               turn_end=turn_end, limits=limits, skipped=skipped)
        return
    plugin = make_env(env_name) if limits is None else guarded_env(env_name, limits)
    missing = [m for m in ("task_prompt", "ground_truth") if not hasattr(plugin, m)]
    if missing:
        raise ValueError(f"environment {env_name!r} does not list tasks with ground truth "
                         f"(no {', '.join(missing)}): it cannot export real trajectories")
    for tid in task_ids:  # a plugin's own failure (its setup raising) costs that task
        yield from _kept(tid, skipped, (Exception,),
                         lambda t=tid: plugin_trajectory(plugin, env_name, t, turn_end=turn_end))


def _kept(task_id: str, skipped: list[tuple[str, str]] | None,
          costs_one: tuple[type[BaseException], ...],
          make: Callable[[], Trajectory]) -> Iterator[Trajectory]:
    """``make()``'s trajectory, or (with ``skipped``) the reason it cannot be made, listed."""
    try:
        traj = make()
    except ExportSkip as exc:
        if skipped is None:
            raise
        skipped.append((task_id, str(exc)))
        return
    except costs_one as exc:
        if skipped is None:
            raise
        skipped.append((task_id, f"{type(exc).__name__}: {str(exc)[:300]}"))
        return
    yield traj
