"""Benchmark: world models on τ² dev, per domain: the learned ranker, the tiny cold start, SmolLM2.

    .venv/bin/python -m experiments.tau2_probes [--models ranker tiny smollm2 LABEL=DIR] \
        [--domains airline retail telecom] [--name tau2_probes]

Runs what a user would, per domain (recorded in the result): export the domain's train and dev
splits' real trajectories, then ``envace probe`` on dev for each model: ``--ranker
train.jsonl`` (the learned ranker), ``--model data/models/tiny-sft`` (the committed BFCL cold
start), ``--model smollm2`` (SmolLM2-135M-Instruct, zero-shot) or ``--model DIR`` for
``LABEL=DIR`` (a fine-tune), all greedy, teacher-forced, each with ``--reference train.jsonl`` so
the audit scores the reference world models (lookup, edit, majority) on the same calls: exact
share and skill against the best reference, with an interval that resamples the environment's
unit (τ²: the task; one dev trajectory per task) (``audit.stats.summary``). Writes
``bench/results/<name>.json`` with the commands, the machine and the load; ``--keep DIR`` keeps
the exports and the probes' output folders.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from envace.core.layout import AUDIT

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
MODELS = {"ranker": ["--ranker", "train.jsonl"],
          "tiny": ["--model", str(ROOT / "data/models/tiny-sft")],
          "smollm2": ["--model", "smollm2"]}


def model_args(spec: str) -> tuple[str, list[str]]:
    """`(label, probe options)` of a --models entry: a known name or ``LABEL=DIR``."""
    if spec in MODELS:
        return spec, MODELS[spec]
    label, sep, path = spec.partition("=")
    if not sep or not label or not path:
        raise SystemExit(f"--models: {spec!r} is neither one of {sorted(MODELS)} nor LABEL=DIR")
    return label, ["--model", str(Path(path).resolve())]


def trained(opts: list[str]) -> dict[str, Any] | None:
    """How a fine-tuned model folder was made (its ``envace_sft.json``, abridged); None else."""
    from envace.model.models import read_sft_meta

    if opts[0] != "--model" or not Path(opts[1]).is_dir():
        return None
    meta = read_sft_meta(opts[1])
    keys = ("preset", "command", "steps", "epochs_done", "stopped_by", "tokens_seen",
            "train_seconds", "wall_seconds", "initial_loss", "final_loss",
            "load_average_at_start", "load_average_at_end")
    return {k: meta.get(k) for k in keys} | {"data": meta.get("data")} if meta else None


def run(cmd: list[str], cwd: str) -> float:
    print("$", " ".join(cmd), flush=True)
    t = time.time()
    subprocess.run([str(BIN / cmd[0]), *cmd[1:]], cwd=cwd, check=True)
    return round(time.time() - t, 1)


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    exact = summary["skill"]["by_scorer"]["exact"]
    return {"steps": summary["counts"]["steps"],
            "trajectories": summary["counts"]["trajectories"],
            "resampling_unit": summary.get("resampling_unit"),
            "exact": summary["scores"]["exact"]["mean"],
            "exact_ci": summary["scores"]["exact"]["ci"],
            "json_f1": summary["scores"].get("json_f1", {}).get("mean"),
            "references_exact": exact["reference_means"],
            "best_reference": exact["best_reference"],
            "skill_vs_best": {k: exact[k] for k in ("point", "lo", "hi")}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["ranker", "tiny"],
                    help=f"{', '.join(MODELS)} or LABEL=DIR (a model folder)")
    ap.add_argument("--domains", nargs="+", default=["airline", "retail", "telecom"])
    ap.add_argument("--name", default="tau2_probes", help="bench/results/<name>.json")
    ap.add_argument("--keep", default=None, help="keep the exports and probe outputs here")
    ap.add_argument("--call-timeout", default="120",
                    help="--call-timeout of every export and probe (default 120 s, not the "
                    "CLI's 30: at a load of 50 on 2 cores tau2's first reset took longer)")
    args = ap.parse_args(argv)
    models = [model_args(m) for m in args.models]
    from bench.machine import run_record, write_result

    load_start = os.getloadavg()
    out: dict[str, Any] = {}
    commands: list[str] = []
    for d in args.domains:
        with tempfile.TemporaryDirectory() as tmp:
            for split in ("train", "dev"):
                cmd = ["envace", "data", "export-real", "--env", "tau2", "--domain", d,
                       "--split", split, "--out", f"{split}.jsonl",
                       "--call-timeout", args.call_timeout]
                run(cmd, tmp)
                commands.append(" ".join(cmd))
            out[d] = {}
            for label, opts in models:
                cmd = ["envace", "probe", *opts, "dev.jsonl", "--reference", "train.jsonl",
                       "--out", f"probe_{label}", "--quiet",
                       "--call-timeout", args.call_timeout]
                load = os.getloadavg()[0]
                secs = run(cmd, tmp)
                commands.append(" ".join(cmd))
                summary = json.loads((Path(tmp) / f"probe_{label}" / AUDIT.summary).read_text())
                out[d][label] = {**figures(summary), "seconds": secs,
                                 "load_1min": [load, os.getloadavg()[0]],
                                 "fine_tune": trained(opts)}
                print(d, label, json.dumps(out[d][label]), flush=True)
            if args.keep:
                shutil.copytree(tmp, Path(args.keep) / d, dirs_exist_ok=True)
    path = write_result(args.name, {
        "env": "tau2", "split": "dev", "commands": commands, "dev": out,
        **run_record("experiments.tau2_probes", argv, load_start),
        "note": "world models probed teacher-forced on each domain's dev ground-truth calls; "
                "references built from the domain's train split; skill against the best "
                "reference (exact), 95 % interval resampling tasks"})
    print(f"-> {path}")


if __name__ == "__main__":
    main()
