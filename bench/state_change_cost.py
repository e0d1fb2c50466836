"""Benchmark: what recording the state change of every call costs the replay.

    .venv/bin/python -m bench.state_change_cost [--repeats 3]

Per environment (BFCL, AgentDojo, τ²-bench) the dev split's real trajectories are replayed by
``audit.pipeline.run_audit`` (one worker, the guarded environment process, no plots) with
``AuditOptions.state_change`` off and on, alternating, ``--repeats`` times each, in one process
(environment data loaded once before timing). The state is read once per call and diffed in the
environment's process (``envace.core.envs.statediff``). Writes
``bench/results/state_change_cost.json``: seconds per run, their medians and the ratio on/off,
with the size of each environment's ``state()``. The ratio of the fastest runs (``min``) is
the figure: the machine is shared, and other load only ever adds time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from bench.machine import run_record, table, write_result
from envace.core.envs.family import family
from envace.core.export import export_real
from envace.core.schema import TrajectoryWriter

ENVS = ("bfcl", "agentdojo", "tau2")


def _export(env: str, path: Path) -> int:
    fam = family(env)
    trajs = list(export_real(fam.split_tasks("dev", "task")))
    with TrajectoryWriter(path, mode="w") as w:
        for t in trajs:
            w.write(t)
    return len(trajs)


def _state_bytes(env: str) -> int:
    fam = family(env)
    task = fam.split_tasks("dev", "task")[0]
    e = fam.new_env(task)
    e.reset(task)
    return len(json.dumps(e.state(), default=repr))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--envs", nargs="+", default=list(ENVS))
    args = p.parse_args(argv)
    load_start = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="envace-statecost-"))
    res: dict = {"repeats": args.repeats, "envs": {}}
    rows = []
    for env in args.envs:
        path = tmp / f"{env}-dev.jsonl"
        n = _export(env, path)
        times: dict[str, list[float]] = {"off": [], "on": []}
        steps = 0
        for r in range(args.repeats):
            for label in ("off", "on"):
                opts = AuditOptions(progress=False, plots=False, state_change=label == "on")
                t0 = time.perf_counter()
                s = run_audit([str(path)], tmp / f"{env}-{label}-{r}", opts)
                times[label].append(time.perf_counter() - t0)
                steps = s["counts"]["steps"]
        med = {k: statistics.median(v) for k, v in times.items()}
        best = {k: min(v) for k, v in times.items()}  # the least disturbed by other load
        res["envs"][env] = {"trajectories": n, "steps": steps, "seconds": times,
                            "median_seconds": med, "min_seconds": best,
                            "ratio_on_over_off_min": best["on"] / best["off"],
                            "ratio_on_over_off_median": med["on"] / med["off"],
                            "state_bytes": _state_bytes(env),
                            "ms_per_call_added_min": 1000 * (best["on"] - best["off"])
                            / max(steps, 1)}
        rows.append([env, steps, best["off"], best["on"], best["on"] / best["off"],
                     med["on"] / med["off"], res["envs"][env]["ms_per_call_added_min"],
                     res["envs"][env]["state_bytes"]])
    print(table(rows, ["env", "steps", "off s (min)", "on s (min)", "on/off (min)",
                       "on/off (median)", "ms/call added", "state bytes"]))
    print("->", write_result("state_change_cost", {**res, **run_record(
        "bench.state_change_cost", argv, load_start)}))


if __name__ == "__main__":
    main()
