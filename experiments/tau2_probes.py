"""Benchmark: world models on τ² dev, per domain: the learned ranker and the tiny cold start.

    .venv/bin/python -m experiments.tau2_probes [--models ranker tiny] \
        [--domains airline retail telecom]

Runs what a user would, per domain (recorded in the result): export the domain's train and dev
splits' real trajectories, then ``envace probe --ranker train.jsonl`` and ``envace probe --model
data/models/tiny-sft`` (the committed BFCL cold start, greedy) on dev, each with ``--reference
train.jsonl`` so the audit scores the reference world models (lookup, edit, majority) on the
same calls: exact share and skill against the best reference, with an interval that resamples
trajectories (``audit.stats.summary``). Writes bench/results/tau2_probes.json with the command, the
machine and the load.
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
from typing import Any

from envace.core.layout import AUDIT

BIN = Path(sys.executable).parent
MODELS = {"ranker": ["--ranker", "train.jsonl"],
          "tiny": ["--model", str(Path(__file__).resolve().parents[1] / "data/models/tiny-sft")]}


def run(cmd: list[str], cwd: str) -> float:
    print("$", " ".join(cmd), flush=True)
    t = time.time()
    subprocess.run([str(BIN / cmd[0]), *cmd[1:]], cwd=cwd, check=True)
    return round(time.time() - t, 1)


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    exact = summary["skill"]["by_scorer"]["exact"]
    return {"steps": summary["counts"]["steps"],
            "trajectories": summary["counts"]["trajectories"],
            "exact": summary["scores"]["exact"]["mean"],
            "exact_ci": summary["scores"]["exact"]["ci"],
            "references_exact": exact["reference_means"],
            "best_reference": exact["best_reference"],
            "skill_vs_best": {k: exact[k] for k in ("point", "lo", "hi")}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--domains", nargs="+", default=["airline", "retail", "telecom"])
    args = ap.parse_args(argv)
    from bench.machine import run_record, write_result

    load_start = os.getloadavg()
    out: dict[str, Any] = {}
    commands: list[str] = []
    for d in args.domains:
        with tempfile.TemporaryDirectory() as tmp:
            for split in ("train", "dev"):
                cmd = ["envace", "data", "export-real", "--env", "tau2", "--domain", d,
                       "--split", split, "--out", f"{split}.jsonl"]
                run(cmd, tmp)
                commands.append(" ".join(cmd))
            out[d] = {}
            for m in args.models:
                cmd = ["envace", "probe", *MODELS[m], "dev.jsonl", "--reference", "train.jsonl",
                       "--out", f"probe_{m}", "--quiet"]
                secs = run(cmd, tmp)
                commands.append(" ".join(cmd))
                summary = json.loads((Path(tmp) / f"probe_{m}" / AUDIT.summary).read_text())
                out[d][m] = {**figures(summary), "seconds": secs}
                print(d, m, json.dumps(out[d][m]), flush=True)
    path = write_result("tau2_probes", {
        "env": "tau2", "split": "dev", "commands": commands, "dev": out,
        **run_record("experiments.tau2_probes", argv, load_start),
        "note": "world models probed teacher-forced on each domain's dev ground-truth calls; "
                "references built from the domain's train split; skill against the best "
                "reference (exact), 95 % interval resampling trajectories"})
    print(f"-> {path}")


if __name__ == "__main__":
    main()
