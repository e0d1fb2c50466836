"""Benchmark: the model presets as world models on AgentDojo dev, beside its reference world models.

    .venv/bin/python -m experiments.presets_agentdojo --models "tiny + SFT=data/models/tiny-sft" \
        "smollm2 zero-shot=.cache/envace/smollm2-135m-instruct-v1" \
        "smollm2 + SFT=.cache/envace/bench-sft-smollm2" --keep runs/presets_agentdojo

Runs what a user would: `envace data export-real --env agentdojo` for the train and dev splits,
then `envace probe --model M dev.jsonl --reference train.jsonl` (teacher-forced, greedy) for each
model. The table gives each model's divergence, exact and json_f1 means, and its skill (exact)
against the best reference world model built from train (lookup or majority), with the
trajectory-bootstrap interval the audit computes. Writes bench/results/presets_agentdojo.json
(machine, load before and after each model, seconds, the commands) and keeps each audit under
--keep. The BFCL presets table is `experiments.presets`; both are in docs/results.md.
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

from bench.machine import run_record, table, write_result
from envace.core.layout import AUDIT

BIN = Path(sys.executable).parent


def _run(cmd: list[str], env: dict[str, str]) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run([str(BIN / cmd[0]), *cmd[1:]], check=False, env=env)


def _row(label: str, s: dict[str, Any]) -> dict[str, Any]:
    skill = ((s.get("skill") or {}).get("by_scorer") or {}).get("exact") or {}
    sc = s.get("scores") or {}
    return {"model": label, "steps": (s.get("counts") or {}).get("scored_steps"),
            "trajectories": (s.get("counts") or {}).get("trajectories"),
            "divergence_rate": s.get("divergence_rate"), "divergence_ci": s.get("divergence_ci"),
            "exact": (sc.get("exact") or {}).get("mean"),
            "json_f1": (sc.get("json_f1") or {}).get("mean"),
            "best_reference": skill.get("best_reference"), "reference_exact": skill.get("f_ref"),
            "skill_exact": skill.get("point"), "skill_ci": [skill.get("lo"), skill.get("hi")]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", required=True, metavar="LABEL=MODEL")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--keep", default=None, help="keep the exports and audits here")
    ap.add_argument("--name", default="presets_agentdojo")
    args = ap.parse_args(argv)
    keep = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="envace-adp-"))
    keep.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    commands: list[str] = []
    files = {}
    for split in ("train", "dev"):
        files[split] = keep / f"agentdojo_{split}.jsonl"
        if not files[split].exists():
            cmd = ["envace", "data", "export-real", "--env", "agentdojo", "--split", split,
                   "--out", str(files[split])]
            _run(cmd, env)
            commands.append(" ".join(cmd))
    rows, models = [], {}
    load_start = os.getloadavg()
    for spec in args.models:
        label, _, model = spec.partition("=")
        out = keep / label.replace(" ", "_").replace("+", "plus")
        cmd = ["envace", "probe", "--model", model, str(files["dev"]), "--reference",
               str(files["train"]), "--out", str(out), "--max-new-tokens",
               str(args.max_new_tokens), "--quiet"]
        t0 = time.perf_counter()
        _run(cmd, env)
        commands.append(" ".join(cmd))
        summary = json.loads((out / AUDIT.summary).read_text())
        row = _row(label, summary)
        models[label] = {**row, "seconds": round(time.perf_counter() - t0, 1),
                         "load_average_after": os.getloadavg(), "audit": str(out),
                         "skill": summary.get("skill")}
        rows.append(row)
    shown = [[r["model"], r["steps"], f"{r['divergence_rate']:.1%}", f"{r['exact']:.3f}",
              f"{r['json_f1']:.3f}", r["best_reference"], f"{r['reference_exact']:.3f}",
              f"{r['skill_exact']:+.2f}", f"[{r['skill_ci'][0]:+.2f}, {r['skill_ci'][1]:+.2f}]"]
             for r in rows]
    header = ["model", "steps", "divergence", "exact", "json_f1", "best reference",
              "reference exact", "skill (exact)", "95% CI"]
    print(table(shown, header))
    path = write_result(args.name, {"env": "agentdojo", "split": "dev",
                                    "reference": "built from the train split's real trajectories",
                                    "probe": "teacher-forced, greedy", "threads": 1,
                                    "load_average": {"start": load_start, "end": os.getloadavg()},
                                    **run_record("experiments.presets_agentdojo", argv, load_start),
                                    "models": models, "commands": commands,
                                    "table": {"header": header, "rows": shown}})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
