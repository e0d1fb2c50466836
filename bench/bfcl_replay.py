"""Benchmark: replaying every ground-truth step of the 800 BFCL tasks, ours vs bfcl-eval's.

    .venv/bin/python -m bench.bfcl_replay [--repeats 3]

Our adapter (parsed name + keyword arguments dispatched to the backend methods) against
bfcl-eval's own ``execute_multi_turn_func_call`` (regex rewriting + ``eval``), in the same run,
on the same calls; plus the cost of resetting a task's state. Writes bench/results/bfcl_replay.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from bench.machine import run_record, table, write_result
from envace.core.envs.bfcl.env import BFCLEnv
from envace.core.envs.bfcl.tasks import load_tasks
from envace.core.envs.bfcl.verify import ground_truth_calls


def run_ours(tasks, calls) -> tuple[float, float, int]:
    env = BFCLEnv()
    t_reset = t_exec = 0.0
    n = 0
    for task, turns in zip(tasks, calls, strict=True):
        a = time.perf_counter()
        env.reset(task)
        b = time.perf_counter()
        for turn in turns:
            for name, args in turn:
                env.execute(name, args)
                n += 1
        t_reset += b - a
        t_exec += time.perf_counter() - b
    return t_reset, t_exec, n


def run_bfcl(tasks, tag: str) -> tuple[float, int]:
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
        execute_multi_turn_func_call,
    )

    n = 0
    a = time.perf_counter()
    for k, task in enumerate(tasks):
        for turn in task.ground_truth:
            res, _ = execute_multi_turn_func_call([c.source for c in turn], task.initial_config,
                                                  task.involved_classes, f"{tag}_{k}", task.id,
                                                  long_context=task.long_context)
            n += len(res)
    return time.perf_counter() - a, n


def summarise(tasks: int, steps: int, ours: list[tuple[float, float]],
              theirs: list[float]) -> dict[str, Any]:
    """The figures of `repeats` runs: `ours` holds (reset seconds, execute seconds) per repeat,
    `theirs` bfcl-eval's seconds per repeat (its reset is inside its first call); medians."""
    reset = statistics.median(x[0] for x in ours)
    ours_total = statistics.median(x[0] + x[1] for x in ours)
    bfcl_total = statistics.median(theirs)
    return {
        "tasks": tasks, "steps": steps,
        "ours_steps_per_s": steps / ours_total,
        "ours_exec_only_steps_per_s": steps / statistics.median(x[1] for x in ours),
        "bfcl_eval_steps_per_s": steps / bfcl_total,
        "ratio_ours_over_bfcl": bfcl_total / ours_total,
        "reset_ms_per_task": 1000 * reset / tasks,
        "note": "both include state setup per task (bfcl-eval builds instances inside its first "
                "call); medians of --repeats runs",
        "repeats": len(ours),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    tasks = list(load_tasks().values())
    env = BFCLEnv()
    calls = []
    for t in tasks:
        env.reset(t)
        calls.append(ground_truth_calls(t, env))
    ours, theirs = [], []
    for r in range(args.repeats):
        t_reset, t_exec, n = run_ours(tasks, calls)
        ours.append((t_reset, t_exec))
        t_b, n_b = run_bfcl(tasks, f"bench{r}")  # bfcl-eval resets inside its first call
        theirs.append(t_b)
        assert n == n_b
    res = summarise(len(tasks), n, ours, theirs)
    print(table([
        ["envace adapter (reset + execute)", res["ours_steps_per_s"], 1.0],
        ["bfcl-eval execute_multi_turn_func_call", res["bfcl_eval_steps_per_s"],
         1 / res["ratio_ours_over_bfcl"]],
    ], ["executor", "steps/s", "throughput vs ours"]))
    print(f"reset: {res['reset_ms_per_task']:.3f} ms per task; ratio ours/bfcl = "
          f"{res['ratio_ours_over_bfcl']:.2f}x")
    print("->", write_result("bfcl_replay", {**res, **run_record("bench.bfcl_replay", argv,
                                                                load_start)}))


if __name__ == "__main__":
    main()
