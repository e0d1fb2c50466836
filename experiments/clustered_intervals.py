"""Benchmark: the BFCL dev intervals of the model-free world models, resampling scenarios
against resampling trajectories (issue 38).

    .venv/bin/python -m experiments.clustered_intervals #
    bench/results/clustered_intervals_bfcl_dev.json .venv/bin/python -m
    experiments.clustered_intervals --env agentdojo  # ..._agentdojo_dev.json

BFCL dev is 30 scenarios x 4 category variants that share most calls, so its trajectories are
not independent. Runs the commands a user would, with no model: export train and dev, then
``envace-audit baseline dev.jsonl --reference train.jsonl --model lookup|edit|majority`` and
``envace probe --ranker train.jsonl dev.jsonl --reference train.jsonl`` (the learned ranker),
each audit clustered by the environment's declared unit (the scenario); then ``envace-audit
rescore DIR --cluster-by trajectory --out DIR_t`` recomputes the same audit resampling
trajectories (the former intervals). Records, for each world model and each unit: exact with
its interval, the divergence rate's interval and its standard error (the bootstrap's
replicates' spread is not kept, so the SE is the cluster-robust one of the ratio), skill
against ``edit`` and ``lookup`` with intervals and Monte-Carlo errors, and the compounding
block (the pooled ratio and the depth trend).
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
MODELS = ("lookup", "edit", "majority")


def run(cmd: list[str], cwd: str) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run([str(BIN / cmd[0]), *cmd[1:]], cwd=cwd, check=True)


def commands(env: str = "bfcl") -> list[list[str]]:
    export = ["envace", "data", "export-real", "--env", env]
    cmds = [[*export, "--split", "train", "--out", "train.jsonl"],
            [*export, "--split", "dev", "--out", "dev.jsonl"]]
    cmds += [["envace-audit", "--quiet", "baseline", "dev.jsonl", "--reference", "train.jsonl",
              "--model", m, "--out", m] for m in MODELS]
    cmds.append(["envace", "probe", "--quiet", "--ranker", "train.jsonl", "dev.jsonl",
                 "--reference", "train.jsonl", "--out", "ranker"])
    for name in (*MODELS, "ranker"):
        cmds.append(["envace-audit", "--quiet", "rescore", name, "--cluster-by", "trajectory",
                     "--out", f"{name}_by_trajectory"])
    return cmds


def robust_se(steps_file: Path, by: str) -> float:
    """The cluster-robust SE of the divergence rate, clusters = ``by`` (audit.stats.clusters)."""
    import numpy as np

    from audit.stats.clusters import cluster_of

    rows = [json.loads(x) for x in steps_file.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if not r.get("unanswered") and r.get("source_rehearsed") is not False]
    sums: dict[str, list[float]] = {}
    for r in rows:
        s = sums.setdefault(cluster_of(r, by), [0.0, 0.0])
        s[0] += float(bool(r["diverged"]))
        s[1] += 1.0
    x, n = np.array(list(sums.values())).T
    p = x.sum() / n.sum()
    g = len(x)
    return float(np.sqrt(((x - p * n) ** 2).sum() * g / (g - 1)) / n.sum())


def figures(summary: dict[str, Any], steps_file: Path) -> dict[str, Any]:
    sk = (summary.get("skill") or {}).get("by_scorer", {}).get("exact", {})
    against = sk.get("against") or {}
    unit = summary.get("resampling_unit")
    comp = summary.get("compounding") or {}
    return {
        "resampling_unit": unit,
        "clusters": (summary.get("interval") or {}).get("clusters"),
        "exact": summary["scores"]["exact"],
        "divergence_rate": summary["divergence_rate"],
        "divergence_ci": summary["divergence_ci"],
        "divergence_ci_mc_error": summary.get("divergence_ci_mc_error"),
        "divergence_se_cluster_robust": robust_se(steps_file, unit or "trajectory"),
        "skill_vs": {ref: against.get(ref) for ref in ("edit", "lookup")},
        "skill_vs_by_scorer": {
            scorer: {ref: {f: (b.get("against") or {}).get(ref, {}).get(f)
                           for f in ("point", "lo", "hi", "mc_error", "method")}
                     for ref in ("edit", "lookup")}
            for scorer, b in ((summary.get("skill") or {}).get("by_scorer") or {}).items()},
        "skill_by_mutates_state": {k: {f: v.get(f) for f in ("point", "lo", "hi", "mc_error",
                                                            "method")}
                                   for k, v in ((summary.get("skill") or {}).get(
                                       "by_mutates_state", {}).get("exact") or {}).items()},
        "skill_novelty_0.75_1.00": {f: ((summary.get("skill") or {}).get("by_novelty", {})
                                        .get("exact", {}).get("0.75-1.00") or {}).get(f)
                                    for f in ("point", "lo", "hi", "mc_error", "method")},
        "compounding": {"ratio": comp.get("ratio"), "ci": comp.get("ci"),
                        "ci_mc_error": comp.get("ci_mc_error"),
                        "depth_trend": comp.get("depth_trend")},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", choices=["bfcl", "agentdojo"], default="bfcl")
    ap.add_argument("--name", help="default: clustered_intervals_<env>_dev")
    args = ap.parse_args(argv)
    args.name = args.name or f"clustered_intervals_{args.env}_dev"
    from bench.machine import run_record, write_result

    load_start = os.getloadavg()
    start = time.time()
    cmds = commands(args.env)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cmd in cmds:
            run(cmd, tmp)
        for name in (*MODELS, "ranker"):
            out[name] = {}
            for d, label in ((name, "declared"), (f"{name}_by_trajectory", "trajectory")):
                summary = json.loads((Path(tmp) / d / AUDIT.summary).read_text())
                out[name][label] = figures(summary, Path(tmp) / d / AUDIT.steps)
    data = {**run_record("experiments.clustered_intervals", argv, load_start),
            "env": args.env, "commands": [" ".join(c) for c in cmds], "results": out,
            "seconds": round(time.time() - start, 1),
            "note": "declared: the environment's unit (BFCL: the scenario, its four category "
                    "variants resampled together; issue 38); trajectory: the same audit "
                    "rescored with --cluster-by trajectory (the intervals published before "
                    "issue 38). 1,000 resamples, seed 0; mc_error = the Monte-Carlo standard "
                    "error of an interval's ends"}
    path = write_result(args.name, data)
    for name, v in out.items():
        for label, f in v.items():
            e = f["skill_vs"].get("edit") or {}
            print(f"{name:9s} {label:10s} exact {f['exact']['mean']:.3f} {f['exact']['ci']} "
                  f"skill vs edit {e.get('point')} [{e.get('lo')}, {e.get('hi')}]")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
