"""Benchmark: end-to-end audit throughput (JSONL in, report out) and peak memory.

    .venv/bin/python -m bench.audit_throughput

Over the real trajectories of all 800 tasks (every ground-truth step): the whole audit (read,
replay, score five ways, statistics with bootstraps, report and plots) with 1 and 2 workers,
against merely executing the same calls with bfcl-eval's own executor, in the same run, as a
ratio. Peak memory (max RSS of the audit process and its workers) on the input and on a 10x
larger one shows that input is streamed. Each audit runs in a fresh subprocess.
Writes bench/results/audit_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
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
import json, resource, sys, time
from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
t = time.perf_counter()
s = run_audit([sys.argv[1]], sys.argv[2], AuditOptions(workers=int(sys.argv[3]), progress=False))
dt = time.perf_counter() - t
rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
          resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({"seconds": dt, "steps": s["counts"]["steps"], "peak_rss_mib": rss / 1024}))
"""


def audit(path: Path, out: Path, workers: int) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), str(out), str(workers)],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    load_start = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="envace-bench-"))
    tasks = list(load_tasks().values())
    one, ten = tmp / "x1.jsonl", tmp / "x10.jsonl"
    trajs = list(export_real(tasks))
    with TrajectoryWriter(one, mode="w") as w1, TrajectoryWriter(ten, mode="w") as w10:
        for t in trajs:
            w1.write(t)
        for i in range(10):
            for t in trajs:
                w10.write(t.model_copy(update={"id": f"{t.id}-{i}"}))
    t_exec, n = run_bfcl(tasks, "auditbench")
    rows, res = [], {"steps": n, "bfcl_execute_seconds": t_exec, "runs": {}}
    rows.append(["bfcl-eval executes the calls only", "x1", 1, t_exec, n / t_exec, 1.0, ""])
    for label, path, workers in (("x1", one, 1), ("x1", one, 2), ("x10", ten, 1)):
        r = audit(path, tmp / f"out-{label}-{workers}", workers)
        ratio = r["seconds"] / (t_exec * (10 if label == "x10" else 1))
        res["runs"][f"{label}_w{workers}"] = {**r, "steps_per_s": r["steps"] / r["seconds"],
                                               "time_over_bfcl_execution": ratio}
        rows.append([f"envace-audit replay ({workers} worker{'s' * (workers > 1)})", label,
                     workers, r["seconds"], r["steps"] / r["seconds"], ratio,
                     f"{r['peak_rss_mib']:.0f}"])
    res["peak_rss_growth_x10_over_x1"] = (res["runs"]["x10_w1"]["peak_rss_mib"]
                                          / res["runs"]["x1_w1"]["peak_rss_mib"])
    print(table(rows, ["what", "input", "workers", "seconds", "steps/s", "time / bfcl exec",
                       "peak RSS MiB"]))
    print(f"peak memory, 10x input over 1x: {res['peak_rss_growth_x10_over_x1']:.2f}")
    print("->", write_result("audit_throughput", {**res, **run_record("bench.audit_throughput",
                                                                      argv, load_start)}))


if __name__ == "__main__":
    main()
