"""Does training teach the world? The world model's bits per byte on held-out real trajectories,
logged while the tiny preset's `grpo` and `envace` recipes train (issue 42, section 3).

    nice -n 10 .venv/bin/python -m experiments.fidelity_nll_curve --steps 4 --every 1 \
        --seeds 0 1 2 --modes grpo envace

Each run is the equal-steps recipe of docs/results.md ("Trained cells and the paper's claims":
``configs/tiny.yaml prompts_per_step=8 group_size=4 lr=3e-4 reward=action_partial``) with
``fidelity_nll_every`` on (``envace.training.fidelity_nll``: the pooled bits per byte of
``fidelity_nll_batch`` fixed real dev trajectories under the policy, before the update of every
K-th step and after the last one), ``steps`` as given, and the final evaluation cut to one task
(the curve is the measurement here). Runs go one at a time, seed by seed (each seed's modes
together), on one thread; the result file is rewritten after every run, so an interrupted
command leaves what it finished. A run directory that already holds a finished run of the same
name is refused (a new ``--runs-dir``).

Writes bench/results/<--name>.json: per run the curve (step, bits per byte, tokens), its start
and end, the step's generation-based ``fidelity/exact`` beside it (rehearsed rollouts only:
``envace``), the wall time and the load average around it; per mode the mean change and its
t-interval over seeds. Seeds run as separate processes (one per mode and seed, in parallel on
two cores) are brought together with ``--combine A.json B.json ... --name NAME``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.machine import run_record, write_result
from envace.core.layout import RUN

RECIPE = ("prompts_per_step=8", "group_size=4", "lr=3e-4", "reward=action_partial",
          "eval_tasks=1", "checkpoint_every=0")


def curve_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The curve of a run's metrics rows: points ``[updates done, bits per byte, tokens]``
    (``fidelity_bpb`` of step s is measured after s updates; ``fidelity_bpb_end`` after all),
    its start and end, and the generation-based exact rate of each step's rehearsals."""
    points = [[r["step"], r["fidelity_bpb"], r["fidelity_bpb_tokens"]]
              for r in rows if r.get("fidelity_bpb") is not None]
    last = rows[-1] if rows else {}
    if last.get("fidelity_bpb_end") is not None:
        points.append([last["step"] + 1, last["fidelity_bpb_end"], last["fidelity_bpb_end_tokens"]])
    exact = [[r["step"], r["fidelity/exact"]] for r in rows
             if isinstance(r.get("fidelity/exact"), float) and not math.isnan(r["fidelity/exact"])]
    start = points[0][1] if points else None
    end = points[-1][1] if points else None
    return {"points": points, "start": start, "end": end,
            "change": None if start is None or end is None else end - start,
            "generation_exact": exact}


def train_run(runs_dir: Path, mode: str, seed: int, steps: int, every: int, batch: int,
              extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One training run as a subprocess; its curve, wall time and load average around it
    (``extra``: more ``key=value`` settings, e.g. ``rehearse_trust=-0.2``, named in the run)."""
    name = f"nll-{mode}-s{seed}" + "".join(f"-{x.replace('=', '')}" for x in extra)
    cmd = [sys.executable, "-m", "envace.cli", "train", "--config", "configs/tiny.yaml",
           f"output_dir={runs_dir}", f"run_name={name}", f"mode={mode}", f"seed={seed}",
           f"steps={steps}", f"fidelity_nll_every={every}", f"fidelity_nll_batch={batch}",
           *RECIPE, *extra, "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    load0, t0 = os.getloadavg(), time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{name} failed ({r.returncode}): {r.stderr[-2000:]}")
    rows = [json.loads(x) for x in (runs_dir / name / RUN.metrics).read_text().splitlines()]
    return {"mode": mode, "seed": seed, "extra": list(extra), "run_dir": str(runs_dir / name),
            "calls": calls_of(rows),
            "command": " ".join(cmd[1:]), "wall_s": round(wall, 1),
            "load_average": {"start": list(load0), "end": list(os.getloadavg())},
            **curve_of(rows)}


def calls_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the run's rollouts cost and earned, per step: mean reward, rehearsed calls and
    calls the confidence gate sent to reality (``calls/gated_real``; absent: no gate)."""
    return {"reward_mean": [r.get("reward/mean") for r in rows],
            "rehearsed": [r.get("calls/rehearsed") for r in rows],
            "gated_real": [r.get("calls/gated_real") for r in rows],
            "per_episode": [r.get("calls/per_episode") for r in rows]}


def seed_interval(values: list[float]) -> list[float] | None:
    """The 95 % t-interval of the mean over seeds (the seed is the unit: each run is one
    draw), None below two seeds."""
    if len(values) < 2:
        return None
    from scipy import stats

    mean = sum(values) / len(values)
    half = stats.t.ppf(0.975, len(values) - 1) * stats.tstd(values) / math.sqrt(len(values))
    return [mean - half, mean + half]


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: the seeds' changes (end - start), their mean and its t-interval over seeds;
    and per seed present in both, ``envace`` - ``grpo``."""
    out: dict[str, Any] = {}
    for mode in dict.fromkeys(r["mode"] for r in runs):
        ch = [r["change"] for r in runs if r["mode"] == mode and r["change"] is not None]
        out[mode] = {"seeds": [r["seed"] for r in runs if r["mode"] == mode], "changes": ch,
                     "mean_change": sum(ch) / len(ch) if ch else None,
                     "interval_over_seeds": seed_interval(ch),
                     "up_in": sum(c > 0 for c in ch)}
    by = {(r["mode"], r["seed"]): r["change"] for r in runs}
    diff = [by[("envace", s)] - by[("grpo", s)] for (m, s) in by
            if m == "envace" and ("grpo", s) in by]
    if diff:
        out["envace_minus_grpo"] = {"seeds": [s for (m, s) in by if m == "envace"
                                              and ("grpo", s) in by],
                                    "per_seed": diff, "mean": sum(diff) / len(diff),
                                    "interval_over_seeds": seed_interval(diff)}
    return out


def combine(name: str, files: list[str], argv: list[str] | None) -> int:
    """One result from the runs of several result files of this command (seeds run apart,
    e.g. one process per mode and seed): their runs, each with the command that made it, and
    the summary over all of them. A run (mode, seed, settings) found twice is refused."""
    runs: list[dict[str, Any]] = []
    settings: list[Any] = []
    for f in files:
        data = json.loads(Path(f).read_text(encoding="utf-8"))
        settings.append(data["settings"])
        runs.extend({**r, "from": str(f)} for r in data["runs"])
    if any(s != settings[0] for s in settings):
        raise SystemExit("the files' settings differ: runs of different recipes do not combine")
    keys = [(r["mode"], r["seed"], tuple(r.get("extra", []))) for r in runs]
    if len(set(keys)) != len(keys):
        raise SystemExit("a run is in more than one file")
    runs.sort(key=lambda r: (r["seed"], r["mode"]))
    write_result(name, {**run_record("experiments.fidelity_nll_curve", argv, os.getloadavg()),
                        "quiet_machine": None, "load_scope": "aggregation",
                        "measured_in": [Path(f).stem for f in files],
                        "settings": settings[0], "combined_from": files,
                        "finished": f"{len(runs)} runs", "runs": runs,
                        "summary": summarise(runs)})
    for mode, block in summarise(runs).items():
        print(mode, json.dumps(block))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8, help="fidelity_nll_batch")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--modes", nargs="+", default=["grpo", "envace"])
    ap.add_argument("--runs-dir", default="runs/nll")
    ap.add_argument("--name", default="fidelity_nll_tiny")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more training settings for every run (e.g. rehearse_trust=-0.214)")
    ap.add_argument("--combine", nargs="+", metavar="RESULT.json",
                    help="train nothing: write --name from the runs of these result files")
    args = ap.parse_args(argv)
    if args.combine:
        return combine(args.name, args.combine, argv)
    load = os.getloadavg()
    runs_dir = Path(args.runs_dir)
    runs: list[dict[str, Any]] = []
    for seed in args.seeds:
        for mode in args.modes:
            runs.append(train_run(runs_dir, mode, seed, args.steps, args.every, args.batch,
                                  tuple(args.set)))
            r = runs[-1]
            print(f"{mode} seed {seed}: {r['start']:.4f} -> {r['end']:.4f} bits per byte "
                  f"({r['wall_s']:.0f} s, load {r['load_average']['start'][0]:.1f}-"
                  f"{r['load_average']['end'][0]:.1f})", flush=True)
            write_result(args.name, {
                **run_record("experiments.fidelity_nll_curve", argv, load),
                "settings": {"steps": args.steps, "every": args.every, "batch": args.batch,
                             "recipe": [*RECIPE, *args.set], "config": "configs/tiny.yaml",
                             "threads": 1},
                "finished": f"{len(runs)} of {len(args.seeds) * len(args.modes)} runs",
                "runs": runs, "summary": summarise(runs)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
