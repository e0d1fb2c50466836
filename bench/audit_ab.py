"""Benchmark: the whole audit before and after a change, on the same machine in the same hour.

    .venv/bin/python -m bench.audit_ab --before 0dd51a4 [--repeats 2] [--copies 10] [--workers 1]

The code at ``--before`` (a git worktree in a temporary folder) and the working tree's, each
running ``audit.pipeline.run_audit`` (``--workers``, default 1; the default call limits, plots
on) over the real
trajectories of all 800 BFCL tasks copied ``--copies`` times with fresh ids (46,250 steps at 10,
as ``bench.audit_throughput`` builds them), alternating, ``--repeats`` times each, each run in a
fresh process with its wall and CPU seconds and the 1-minute load around it; beside them
bfcl-eval executing the same calls (``bench.bfcl_replay.run_bfcl``, median of three, times the
copies) and each run's ratio to that. The two trees' ``steps.jsonl`` and ``trajectories.jsonl``
must be byte-identical (``identical_outputs``). Writes bench/results/<--name>.json.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.audit_throughput import CHILD
from bench.bfcl_replay import run_bfcl
from bench.machine import run_record, table, write_result
from envace.core.envs.bfcl.tasks import load_tasks
from envace.core.export import export_real
from envace.core.layout import AUDIT
from envace.core.schema import TrajectoryWriter

ROOT = Path(__file__).resolve().parents[1]
#: the child also prints the audit process's CPU seconds
TIMED = (CHILD
         .replace("\nt = time.perf_counter()\n",
                  "\nt = time.perf_counter(); c = time.process_time()\n")
         .replace('{"seconds": dt,',
                  '{"seconds": dt, "cpu_seconds": time.process_time() - c,'))
if TIMED.count("process_time") != 2:
    raise RuntimeError("bench.audit_throughput's child changed: audit_ab cannot time its CPU")


def build_input(tmp: Path, copies: int) -> Path:
    """The 800 BFCL tasks' real trajectories ``copies`` times, fresh ids after the first."""
    one = tmp / "x1.jsonl"
    trajs = list(export_real(list(load_tasks().values())))
    with TrajectoryWriter(one, mode="w") as w:
        for t in trajs:
            w.write(t)
    lines = one.read_text(encoding="utf-8").splitlines(keepends=True)
    out = tmp / f"x{copies}.jsonl"
    with open(out, "w", encoding="utf-8") as fh:
        for i in range(copies):
            for t, line in zip(trajs, lines, strict=True):
                old = f'"id": {json.dumps(t.id)}'
                fh.write(line if i == 0 else
                         line.replace(old, f'"id": {json.dumps(f"{t.id}-{i}")}', 1))
    return out


assert TIMED.count("c = time.process_time()") == 1 and "cpu_seconds" in TIMED


def audit(tree: Path, path: Path, out: Path, workers: int = 1) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    r = subprocess.run([sys.executable, "-c", TIMED, str(path), str(out), str(workers), "on"],
                       capture_output=True, text=True, check=True, env=env, cwd=tree)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the commit to compare the working tree to")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--copies", type=int, default=10)
    ap.add_argument("--name", default="audit_speed_ab")
    ap.add_argument("--workers", type=int, default=1,
                    help="audit worker processes, both trees (default: %(default)s)")
    args = ap.parse_args(argv)
    load = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="envace-ab-"))
    old = tmp / "before"
    subprocess.run(["git", "worktree", "add", "--detach", str(old), args.before], cwd=ROOT,
                   check=True, capture_output=True)
    try:
        path = build_input(tmp, args.copies)
        runs = [run_bfcl(list(load_tasks().values()), f"ab{r}") for r in range(3)]
        bfcl = statistics.median(t for t, _ in runs) * args.copies
        res: dict = {"before": args.before, "copies": args.copies, "workers": args.workers,
                     "steps": None,
                     "bfcl_execute_seconds": bfcl, "runs": []}
        rows = [["bfcl-eval executes the calls (median of 3)", "-", bfcl, "-", 1.0]]
        for r in range(args.repeats):
            for label, tree in (("before", old), ("after", ROOT)):
                out = tmp / f"out-{label}-{r}"
                got = audit(tree, path, out, args.workers)
                if r == 0:
                    keep = tmp / f"keep-{label}"
                    shutil.copytree(out, keep)
                shutil.rmtree(out, ignore_errors=True)
                res["steps"] = got["steps"]
                res["runs"].append({"code": label, **got, "ratio_over_bfcl": got["seconds"] / bfcl})
                rows.append([f"audit, {label}", r, got["seconds"], got["cpu_seconds"],
                             got["seconds"] / bfcl])
        res["identical_outputs"] = all(
            filecmp.cmp(tmp / "keep-before" / f, tmp / "keep-after" / f, shallow=False)
            for f in (AUDIT.steps, AUDIT.trajectories))
        for label in ("before", "after"):
            secs = [x["seconds"] for x in res["runs"] if x["code"] == label]
            res[f"median_seconds_{label}"] = statistics.median(secs)
        res["speedup_median"] = res["median_seconds_before"] / res["median_seconds_after"]
        print(table(rows, ["what", "repeat", "seconds", "CPU s (audit process)", "/ bfcl exec"]))
        print(f"identical outputs: {res['identical_outputs']}; before / after (medians): "
              f"{res['speedup_median']:.2f}")
        print("->", write_result(args.name, {**res, **run_record("bench.audit_ab", argv, load)}))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT,
                       capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
