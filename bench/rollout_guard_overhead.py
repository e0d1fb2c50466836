"""Benchmark: what running each real-mode episode's backend in a killable child costs a rollout.

    nice -n 10 .venv/bin/python -m bench.rollout_guard_overhead [--repeats 3] [--model smollm2]

A real-mode rollout (grpo, anchored groups, ``envace eval``, the oracle world) builds one backend
per episode with ``task_environment(task, limits)`` and sends the policy's calls one at a time as
they are written (``envace.model.rollout``); with the call limits on, that backend lives in a
child forked from the trainer, so the fork's cost grows with the trainer's memory. This runs,
in a fresh process holding the policy model (``--model``, loaded as training would), the
episode lifecycle of every BFCL dev task (per-turn tasks, as training uses them): build and
reset, each ground-truth call of the task's turn one round trip at a time, close; with the
limits on and off, interleaved. Wall-clock and CPU seconds (the process and its children),
per episode and per call. Writes bench/results/rollout_guard_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

from bench.machine import run_record, table, write_result

CHILD = r"""
import json, sys, time, resource
import torch
torch.set_num_threads(1)
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.envs.bfcl.turns import turn_tasks
from envace.core.envs.limits import CallLimits
from envace.core.envs.task_envs import close_env, task_environment
from envace.core.export import export_real
from envace.model.models import default_cache_dir, load_model, resolve_model

model_spec, mode = sys.argv[1], sys.argv[2]
path = resolve_model(model_spec, default_cache_dir()) if model_spec != "none" else None
held = load_model(path) if path is not None else None  # the trainer's memory, as forked
rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
tasks = turn_tasks(split_tasks("dev"))
# each per-turn task's own calls: the ground truth of its turn (what a good policy commits)
truth = {t.id: t for t in split_tasks("dev")}
calls = {}
for traj in export_real(truth.values(), turn_end=True):
    per_turn = [[]]  # each turn ends with an assistant message without calls (turn_end)
    for m in traj.messages:
        if m.role == "assistant" and not m.tool_calls:
            per_turn.append([])
        for c in m.tool_calls or []:
            per_turn[-1].append((c.function.name, c.function.arguments))
    calls[traj.task_id] = per_turn
limits = CallLimits(30.0, 4096) if mode == "on" else CallLimits(None, None)
n_calls = 0
t0, c0 = time.perf_counter(), time.process_time()
for task in tasks:
    env = task_environment(task, limits)
    for name, args in calls[task.base_id][int(task.id.rsplit("@t", 1)[1])]:
        env.execute(name, args)
        n_calls += 1
    close_env(env)
print(json.dumps({"seconds": time.perf_counter() - t0, "episodes": len(tasks),
                  "calls": n_calls, "parent_rss_mb": rss_mb}))
"""


def episodes(model: str, mode: str) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, "-c", CHILD, model, mode], capture_output=True,
                       text=True)
    if r.returncode:
        raise SystemExit(f"the {mode} run failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = json.loads(r.stdout.strip().splitlines()[-1])
    # the whole process (its imports and model load included, the same for both modes)
    res["cpu_seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return res


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default="smollm2", help="the policy held in memory (none: no model)")
    args = p.parse_args(argv)
    load = os.getloadavg()
    wall: dict[str, list[float]] = {"on": [], "off": []}
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    last: dict = {}
    for _ in range(args.repeats):
        for mode in ("off", "on"):
            last = episodes(args.model, mode)
            wall[mode].append(last["seconds"])
            cpu[mode].append(last["cpu_seconds"])
    med = {m: statistics.median(v) for m, v in wall.items()}
    cmed = {m: statistics.median(v) for m, v in cpu.items()}
    n_ep, n_calls = last["episodes"], last["calls"]
    res = {"model": args.model, "parent_rss_mb": last["parent_rss_mb"], "episodes": n_ep,
           "calls": n_calls, "wall_seconds": wall, "median_wall_seconds": med,
           "cpu_seconds": cpu, "median_cpu_seconds": cmed,
           "wall_overhead_ms_per_episode": (med["on"] - med["off"]) / n_ep * 1000,
           "cpu_overhead_ms_per_episode": (cmed["on"] - cmed["off"]) / n_ep * 1000,
           "note": "wall seconds: the episode loop only; cpu seconds: the whole process and its "
                   "children (imports and the model load, the same for both modes, included)",
           **run_record("bench.rollout_guard_overhead", argv, load)}
    print(table([[m, med[m], cmed[m]] for m in ("off", "on")],
                ["call limits", "median wall s (episodes)", "median cpu s (process)"]))
    print(f"{n_ep} episodes, {n_calls} calls, parent {last['parent_rss_mb']:.0f} MB: "
          f"+{res['wall_overhead_ms_per_episode']:.1f} ms wall, "
          f"+{res['cpu_overhead_ms_per_episode']:.1f} ms cpu per episode")
    write_result("rollout_guard_overhead", res)


if __name__ == "__main__":
    main()
