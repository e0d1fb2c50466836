"""Benchmark: end-to-end audit throughput (JSONL in, report out) and peak memory by input size.

    .venv/bin/python -m bench.audit_throughput [--sizes 1 10 100]

Over the real trajectories of all 800 BFCL tasks (every ground-truth step, 4,625 steps; copies
with fresh ids make the 10x and 100x inputs): the whole audit (read, replay under the default
call limits, score five ways, statistics with bootstraps, report and plots) with 1 worker at
every size and 2 workers at 1x and 10x (two cores against bfcl-eval's one: read it as
what a user with two cores gets), against merely executing the same calls with bfcl-eval's own
executor in the same run (the reference of issue 44: `bench.bfcl_replay.run_bfcl`, median of
three runs, times the copies), as a ratio. Peak memory of the audit's process (ru_maxrss;
the environment's own process under the call limits is apart: a child that ended, e.g. killed
past its limit, is recorded as `ended_children_peak_rss_mib`) per size, each audit in a fresh
subprocess, shows whether memory stays flat as the input grows (issue 44: 100x within 1.2x of
10x). One more run at 1x with the call limits off
(`--call-timeout 0 --call-memory-mb 0`: the environment in the audit's own process, as bfcl-eval
runs it) separates the limits' process round trips from the audit's own work.
Writes bench/results/audit_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.bfcl_replay import run_bfcl
from bench.machine import run_record, table, write_result
from envace.core.envs.bfcl.tasks import load_tasks
from envace.core.export import export_real
from envace.core.schema import TrajectoryWriter

CHILD = r"""
import json, os, resource, sys, time
from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
limits = {} if sys.argv[4] == "on" else {"call_timeout_s": None, "call_memory_mb": None}
load = os.getloadavg()[0]
t = time.perf_counter()
s = run_audit([sys.argv[1]], sys.argv[2], AuditOptions(workers=int(sys.argv[3]), progress=False,
                                                       **limits))
dt = time.perf_counter() - t
own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
ended = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
with open(os.path.join(sys.argv[2], "steps.jsonl"), encoding="utf-8") as fh:
    timeouts = sum('"timeout": true' in line for line in fh)
print(json.dumps({"seconds": dt, "steps": s["counts"]["steps"], "peak_rss_mib": own,
                  "ended_children_peak_rss_mib": ended, "diverged": s["counts"]["diverged"],
                  "skipped": s["counts"]["skipped"], "timed_out_calls": timeouts,
                  "load_1min": [load, os.getloadavg()[0]]}))
"""

def audit(path: Path, out: Path, workers: int, limits: str = "on") -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), str(out), str(workers), limits],
                       capture_output=True, text=True, check=True)
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 100],
                    help="input sizes, in copies of the 4,625 steps (default: %(default)s)")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="envace-bench-"))
    tasks = list(load_tasks().values())
    trajs = list(export_real(tasks))
    inputs = {1: tmp / "x1.jsonl"}
    with TrajectoryWriter(inputs[1], mode="w") as w:
        for t in trajs:
            w.write(t)
    lines = inputs[1].read_text(encoding="utf-8").splitlines(keepends=True)
    for k in sorted(set(args.sizes) - {1}):  # copies with fresh ids (the id is written first)
        inputs[k] = tmp / f"x{k}.jsonl"
        with open(inputs[k], "w", encoding="utf-8") as fh:
            for i in range(k):
                for t, line in zip(trajs, lines, strict=True):
                    old = f'"id": {json.dumps(t.id)}'
                    fh.write(line.replace(old, f'"id": {json.dumps(f"{t.id}-{i}")}', 1))
    runs = [run_bfcl(tasks, f"auditbench{r}") for r in range(3)]
    t_exec, n = statistics.median(t for t, _ in runs), runs[0][1]
    res: dict = {"steps": n, "bfcl_execute_seconds": t_exec,
                 "bfcl_execute_seconds_runs": [t for t, _ in runs], "runs": {}}
    rows = [["bfcl-eval executes the calls only (median of 3)", "x1", 1, "-", t_exec,
             n / t_exec, 1.0, ""]]
    plan = [(1, 1, "on"), (1, 2, "on"), (1, 1, "off")] + [(k, 1, "on") for k in args.sizes
                                                         if k != 1]
    if 10 in args.sizes:  # the size with both cores: the environment's process of one
        plan.append((10, 2, "on"))  # worker runs while the other worker scores
    for k, workers, limits in plan:
        r = audit(inputs[k], tmp / f"out-{k}-{workers}-{limits}", workers, limits)
        ratio = r["seconds"] / (t_exec * k)
        name = f"x{k}_w{workers}" + ("_limits_off" if limits == "off" else "")
        res["runs"][name] = {**r, "steps_per_s": r["steps"] / r["seconds"],
                             "time_over_bfcl_execution": ratio}
        rows.append([f"envace-audit replay ({workers} worker{'s' * (workers > 1)})", f"x{k}",
                     workers, limits, r["seconds"], r["steps"] / r["seconds"], ratio,
                     f"{r['peak_rss_mib']:.0f}"])
    rss = {k: res["runs"][f"x{k}_w1"]["peak_rss_mib"] for k in args.sizes if k != 1}
    rss[1] = res["runs"]["x1_w1"]["peak_rss_mib"]
    sizes = sorted(rss)
    for a, b in zip(sizes, sizes[1:], strict=False):
        res[f"peak_rss_growth_x{b}_over_x{a}"] = rss[b] / rss[a]
    print(table(rows, ["what", "input", "workers", "call limits", "seconds", "steps/s",
                       "time / bfcl exec", "peak RSS MiB"]))
    for a, b in zip(sizes, sizes[1:], strict=False):
        print(f"peak memory, x{b} input over x{a}: {res[f'peak_rss_growth_x{b}_over_x{a}']:.2f}")
    shutil.rmtree(tmp, ignore_errors=True)
    print("->", write_result("audit_throughput", {**res, **run_record("bench.audit_throughput",
                                                                      argv, load_start)}))


if __name__ == "__main__":
    main()
