"""Benchmark: what running every environment call in a killable child costs the replay audit.

    nice -n 10 .venv/bin/python -m bench.guard_overhead [--repeats 3]

The whole audit (one worker, no plots) of the real trajectories of all 800 BFCL tasks, with the
call limits on (``envace.core.envs.guard``: the environment in a forked child, a trajectory's
calls sent in one batch and streamed back) and off (the environment in the audit's process),
interleaved, each in a fresh subprocess. Wall-clock seconds, and CPU seconds (user + system of
the audit process and every process under it, the environment's child included: it is reaped
before the audit exits), which a loaded machine disturbs far less than wall-clock time; the
overhead is given on both. Writes bench/results/guard_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.machine import run_record, table, write_result
from envace.core.envs.bfcl.tasks import load_tasks
from envace.core.export import export_real
from envace.core.schema import TrajectoryWriter

CHILD = r"""
import json, sys, time
from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
on = sys.argv[3] == "on"
opts = AuditOptions(progress=False, plots=False, call_timeout_s=30.0 if on else None,
                    call_memory_mb=4096 if on else None)
t = time.perf_counter()
s = run_audit([sys.argv[1]], sys.argv[2], opts)
print(json.dumps({"seconds": time.perf_counter() - t, "steps": s["counts"]["steps"]}))
"""


def audit(path: Path, out: Path, mode: str) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), str(out), mode],
                       capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["cpu_seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return res


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    load = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="envace-bench-"))
    src = tmp / "real.jsonl"
    with TrajectoryWriter(src, mode="w") as w:
        for t in export_real(load_tasks().values()):
            w.write(t)
    times: dict[str, list[float]] = {"on": [], "off": []}
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    steps = 0
    for i in range(args.repeats):
        for mode in ("off", "on"):
            r = audit(src, tmp / f"{mode}{i}", mode)
            times[mode].append(r["seconds"])
            cpu[mode].append(r["cpu_seconds"])
            steps = r["steps"]
    med = {m: statistics.median(v) for m, v in times.items()}
    cmed = {m: statistics.median(v) for m, v in cpu.items()}
    res = {"steps": steps, "trajectories": len(load_tasks()), "workers": 1,
           "wall_seconds": times, "median_wall_seconds": med,
           "cpu_seconds": cpu, "median_cpu_seconds": cmed,
           "wall_overhead_ratio": med["on"] / med["off"],
           "cpu_overhead_ratio": cmed["on"] / cmed["off"],
           "cpu_overhead_ms_per_step": (cmed["on"] - cmed["off"]) / steps * 1000,
           "note": "cpu seconds include the audit process's start (imports), the same for both",
           **run_record("bench.guard_overhead", argv, load)}
    print(table([[m, med[m], cmed[m], steps / med[m]] for m in ("off", "on")],
                ["call limits", "median wall s", "median cpu s", "steps/s (wall)"]))
    print(f"overhead: cpu x{res['cpu_overhead_ratio']:.3f} "
          f"({res['cpu_overhead_ms_per_step']:.3f} ms/step), "
          f"wall x{res['wall_overhead_ratio']:.3f}")
    write_result("guard_overhead", res)


if __name__ == "__main__":
    main()
