"""How long the dashboard takes to open a run with 100,000 audited steps, cold and warm.

    .venv/bin/python bench/dashboard_load.py [--steps 100000] [--source AUDIT_DIR] [--keep DIR]

Makes an audit directory of N steps by replicating the steps of a real audit (by default it
makes one: ``envace data export-real --split dev`` audited by ``envace-audit baseline --model
lookup``, 648 steps with realistic divergent responses), renaming trajectories so each copy is
distinct. Then times, through the cached readers of ``dashboard/data.py``:

- cold: cache cleared, read steps.jsonl (compact frame), trajectories.jsonl and summary.json;
- warm: the same calls again (served from ``st.cache_data``, keyed on path, size and mtime);
- one trajectory's texts (the Trajectories page's conversation);
- each page opened through ``streamlit.testing.v1.AppTest`` on that run, first and second time.

Writes ``bench/results/dashboard_load.json`` (with platform, CPU count, Python) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envace.core.layout import AUDIT  # noqa: E402  (this checkout's, by the path above)

OUT = ROOT / "bench" / "results" / "dashboard_load.json"


def _bin(name: str, module: str) -> list[str]:
    exe = Path(sys.executable).parent / name
    return [str(exe)] if exe.exists() else [sys.executable, "-m", module]


def make_source(work: Path) -> Path:
    """A real audit with divergence: the lookup world model over the dev split."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}

    def run(args: list[str]) -> None:
        subprocess.run(args, cwd=work, check=True, capture_output=True, env=env)

    envace, audit = _bin("envace", "envace.cli"), [*_bin("envace-audit", "audit.cli"), "--quiet"]
    run([*envace, "data", "export-real", "--split", "dev", "--out", "dev.jsonl"])
    train = (ROOT / "data" / "splits" / "train.txt").read_text().split()[::4]
    run([*envace, "data", "export-real", "--tasks", *train, "--out", "train.jsonl"])
    r = subprocess.run([*audit, "baseline", "dev.jsonl", "--reference", "train.jsonl", "--model",
                        "lookup", "--out", "source"], cwd=work, capture_output=True, env=env)
    if r.returncode not in (0, 3):
        raise SystemExit(r.stderr.decode()[-2000:])
    return work / "source"


def replicate(src: Path, dst: Path, n_steps: int) -> int:
    """Copy ``src``'s steps (and trajectory rows) until ``n_steps`` steps; returns the count."""
    steps = (src / AUDIT.steps).read_text().splitlines()
    trajs = (src / AUDIT.trajectories).read_text().splitlines()
    dst.mkdir(parents=True, exist_ok=True)
    written, copy = 0, 0
    with open(dst / AUDIT.steps, "w") as fs, open(dst / AUDIT.trajectories, "w") as ft:
        while written < n_steps:
            for line in steps:
                if written >= n_steps:
                    break
                rec = json.loads(line)
                rec["trajectory_id"] = f"{rec['trajectory_id']}#{copy}"
                fs.write(json.dumps(rec) + "\n")
                written += 1
            for line in trajs:
                rec = json.loads(line)
                rec["trajectory_id"] = f"{rec['trajectory_id']}#{copy}"
                ft.write(json.dumps(rec) + "\n")
            copy += 1
    summary = json.loads((src / AUDIT.summary).read_text())
    summary["counts"]["steps"] = summary["counts"]["answered_steps"] = written
    (dst / AUDIT.summary).write_text(json.dumps(summary))
    return written


def timed(fn, *args) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t, out


def bench_readers(audit: Path) -> dict[str, float]:
    from dashboard import data

    data.clear()
    out = {}
    out["cold_steps_s"], frame = timed(data.steps, audit)
    out["cold_trajectories_s"], _ = timed(data.trajectories, audit)
    out["cold_summary_s"], _ = timed(data.summary, audit)
    out["cold_total_s"] = out["cold_steps_s"] + out["cold_trajectories_s"] + out["cold_summary_s"]
    out["warm_steps_s"], _ = timed(data.steps, audit)
    out["warm_trajectories_s"], _ = timed(data.trajectories, audit)
    out["warm_summary_s"], _ = timed(data.summary, audit)
    out["warm_total_s"] = out["warm_steps_s"] + out["warm_trajectories_s"] + out["warm_summary_s"]
    f = frame.frame
    tid = f["trajectory_id"].iloc[len(f) // 2]
    offsets = f.loc[f["trajectory_id"] == tid, "offset"].tolist()
    out["one_trajectory_texts_s"], _ = timed(data.step_texts, audit, offsets)
    out["steps_frame_mb"] = round(f.memory_usage(deep=True).sum() / 2**20, 1)
    return out


def bench_pages(root: Path) -> dict[str, float]:
    """Each page through AppTest on the big run: the first open (cold cache) and the second."""
    os.environ["ENVACE_DASHBOARD_ROOT"] = str(root)
    from streamlit.testing.v1 import AppTest

    from dashboard import data

    data.clear()
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=600)
    at.query_params["run"] = "big"
    out = {}
    for page in ("runs", "fidelity", "trajectories"):
        for n in ("first", "second"):
            t = time.perf_counter()
            at.switch_page(f"views/{page}.py").run()
            out[f"page_{page}_{n}_s"] = time.perf_counter() - t
            if at.exception:
                raise SystemExit(f"{page}: {at.exception[0].value}")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--source", type=Path, help="an audit directory to replicate")
    ap.add_argument("--keep", type=Path, help="build the big run here and keep it")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    work = Path(args.keep or tempfile.mkdtemp(prefix="dashboard-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    src = args.source or make_source(work)
    n = replicate(src, work / "root" / "big", args.steps)
    size = (work / "root" / "big" / AUDIT.steps).stat().st_size
    res = {"steps": n, "steps_jsonl_mb": round(size / 2**20, 1),
           **bench_readers(work / "root" / "big"), **bench_pages(work / "root")}
    res = {k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}
    from bench.machine import machine as machine_facts
    from bench.machine import run_record, write_result

    record = run_record("bench.dashboard_load", argv, load_start)
    record["command"] = record["command"].replace("python -m bench.dashboard_load",
                                                  "python bench/dashboard_load.py")
    write_result(OUT.stem, {**record, "results": res})
    machine = machine_facts()
    print(f"{'measure':<28} value")
    for k, v in res.items():
        print(f"{k:<28} {v}")
    print(f"machine: {machine['platform']}, {machine['cpus']} CPUs, "
          f"Python {machine['python']}")
    print(f"-> {OUT}")


if __name__ == "__main__":
    main()
