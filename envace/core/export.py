"""Real trajectories: each task's ground-truth calls executed in the real BFCL environment.

    envace data export-real --split dev --out dev.jsonl

Each task becomes one trajectory (`source: "real"`): per turn, the user's message, then one
assistant message per ground-truth call with the real response as a tool message
(``rehearsed: false``), then an empty assistant message that ends the turn (the policy learns to
stop calling tools). A miss_func turn that only restores withheld tools gets a system message
naming them. These files are the SFT data, the audit's determinism check and the source of the
reference world models.

Other environments (``export_env``): AgentDojo user tasks (one user turn, the ground-truth calls,
then the task's expected answer as the final assistant message; ``env`` records the benchmark
version), and any environment that lists its tasks (``task_ids``, ``task_prompt``,
``ground_truth``: the optional protocol methods of ``envace.core.envs.base``, e.g. a plugin).

    envace data export-real --env agentdojo --split dev --out dev.jsonl

With ``limits`` (the CLI's ``--call-timeout``; ``envace.core.envs.guard``) the environment runs
in a child process and every call is under the limit; a task whose call runs past it, or (a
plugin) whose reset or calls raise, is not written but named in ``skipped`` (task id, reason):
it costs that task, and the CLI exits 3.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from envace.core.envs.base import Environment
from envace.core.envs.bfcl import BFCLEnv
from envace.core.envs.guard import CallLimits, CallTimeout, EnvProcessDied, guarded_env
from envace.core.envs.tasks import Task
from envace.core.envs.verify import ground_truth_calls
from envace.core.schema import Message, Trajectory


def real_trajectory(task: Task, env: BFCLEnv | None = None, turn_end: bool = True) -> Trajectory:
    """Execute a task's ground truth and record it as a real trajectory."""
    env = env or BFCLEnv()
    env.reset(task)
    messages: list[dict[str, Any]] = []
    step = 0
    for turn, calls in enumerate(ground_truth_calls(task, env)):
        messages.extend(task.turn_messages(turn))
        step = _run_calls(env, calls, messages, step)
        if turn_end:
            messages.append({"role": "assistant", "content": ""})
    return Trajectory(
        id=f"real-{task.id}",
        task_id=task.id,
        env={"name": "bfcl", "task": task.id},
        source="real",
        messages=[Message.model_validate(m) for m in messages],
        tools=task.tools(),
        reward=1.0,
        meta={"category": task.category, "scenario": task.scenario,
              "backends": task.involved_classes},
    )


class ExportSkip(Exception):
    """A task whose real trajectory cannot be recorded (a call past its limit)."""


def _run_calls(env: Environment, calls: list[tuple[str, dict[str, Any]]],
               messages: list[dict[str, Any]], step: int) -> int:
    """Execute calls, appending one assistant message and one tool message per call."""
    for name, args in calls:
        call_id = f"c{step}"
        result = env.execute(name, args)
        if getattr(result, "timeout", False):  # not a real response: never written as one
            raise ExportSkip(f"call {step} ({name!r:.80}): {result.content[:200]}")
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        tool_msg = {"role": "tool", "tool_call_id": call_id, "name": name,
                    "content": result.content, "rehearsed": False}
        if result.error:
            tool_msg["error"] = True
        messages.append(tool_msg)
        step += 1
    return step


def agentdojo_trajectory(task: Any, env: Any = None, turn_end: bool = True) -> Trajectory:
    """An AgentDojo task's ground truth as a real trajectory; reward from its own checker."""
    from envace.core.envs.agentdojo import AgentDojoEnv
    from envace.core.envs.agentdojo_verify import check_calls

    env = env or AgentDojoEnv(task.version)
    env.reset(task)
    messages: list[dict[str, Any]] = task.turn_messages(0)
    _run_calls(env, task.calls(), messages, 0)
    if turn_end:
        messages.append({"role": "assistant", "content": task.ground_truth_output})
    check = check_calls(task, task.calls(), task.ground_truth_output)
    return Trajectory(
        id=f"real-{task.id}",
        task_id=task.id,
        env={"name": "agentdojo", "task": task.id, "version": task.version},
        source="real",
        messages=[Message.model_validate(m) for m in messages],
        tools=task.tools(),
        reward=1.0 if check.valid else 0.0,
        meta={"category": task.suite, "suite": task.suite, "version": task.version,
              "difficulty": task.difficulty},
    )


def plugin_trajectory(env: Any, env_name: str, task_id: str, turn_end: bool = True
                      ) -> Trajectory:
    """A listed task's ground truth, for an environment with the optional catalogue methods."""
    env.reset(task_id)
    messages: list[dict[str, Any]] = [{"role": "user", "content": env.task_prompt(task_id)}]
    _run_calls(env, env.ground_truth(task_id), messages, 0)
    if turn_end:
        messages.append({"role": "assistant", "content": ""})
    return Trajectory(
        id=f"real-{task_id}", task_id=task_id, env={"name": env_name, "task": task_id},
        source="real", messages=[Message.model_validate(m) for m in messages],
        tools=env.tools(), meta={"category": env_name},
    )


def export_env(env_name: str, task_ids: Iterable[str], turn_end: bool = True,
               version: str | None = None, limits: CallLimits | None = None,
               skipped: list[tuple[str, str]] | None = None) -> Iterator[Trajectory]:
    """Real trajectories of any environment but BFCL (use :func:`export_real` for BFCL);
    ``limits``/``skipped``: see the module docstring (without ``skipped`` a failure raises)."""
    if env_name == "agentdojo":
        from envace.core.envs.agentdojo_tasks import DEFAULT_VERSION, get_task

        version = version or DEFAULT_VERSION
        env = _env("agentdojo", limits, version=version)
        for tid in task_ids:
            yield from _kept(tid, skipped, (CallTimeout, EnvProcessDied),
                             lambda t=tid: agentdojo_trajectory(get_task(t, version), env,
                                                                turn_end=turn_end))
        return
    plugin = _env(env_name, limits)
    missing = [m for m in ("task_prompt", "ground_truth") if not hasattr(plugin, m)]
    if missing:
        raise ValueError(f"environment {env_name!r} does not list tasks with ground truth "
                         f"(no {', '.join(missing)}): it cannot export real trajectories")
    for tid in task_ids:  # a plugin's own failure (its setup raising) costs that task
        yield from _kept(tid, skipped, (Exception,),
                         lambda t=tid: plugin_trajectory(plugin, env_name, t, turn_end=turn_end))


def export_real(tasks: Iterable[Task], turn_end: bool = True, limits: CallLimits | None = None,
                skipped: list[tuple[str, str]] | None = None) -> Iterator[Trajectory]:
    env = _env("bfcl", limits)
    for task in tasks:
        yield from _kept(task.id, skipped, (CallTimeout, EnvProcessDied),
                         lambda t=task: real_trajectory(t, env, turn_end=turn_end))


def _env(name: str, limits: CallLimits | None, **kwargs: Any) -> Any:
    if limits is None:  # in this process (the library default: tests, training data)
        from envace.core.envs.base import make_env

        return make_env(name, **kwargs)
    return guarded_env(name, limits, **kwargs)


def _kept(task_id: str, skipped: list[tuple[str, str]] | None,
          costs_one: tuple[type[BaseException], ...], make: Any) -> Iterator[Trajectory]:
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
