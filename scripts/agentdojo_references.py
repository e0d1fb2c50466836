"""Reference world models on AgentDojo dev: the figures a learned world model has to beat.

    .venv/bin/python scripts/agentdojo_references.py   # bench/results/agentdojo_references.json

Runs exactly the commands a user would (recorded in the result): export the train and dev
splits' real trajectories, replay all 97 tasks (the determinism check: must be 0 % divergence),
then ``envace-audit baseline`` for the ``lookup`` and ``majority`` references built from train.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envace.core.layout import AUDIT  # noqa: E402  (this checkout's, by the path above)

BIN = Path(sys.executable).parent


def run(cmd: list[str], cwd: str) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run([str(BIN / cmd[0]), *cmd[1:]], cwd=cwd, check=True)


def figures(summary: dict) -> dict:
    scores = summary["scores"]
    return {
        "steps": summary["counts"]["steps"],
        "trajectories": summary["counts"]["trajectories"],
        "divergence_rate": summary["divergence_rate"],
        "exact": scores["exact"]["mean"],
        "exact_ci": scores["exact"]["ci"],
        "json_f1": scores["json_f1"]["mean"],
        "fuzzy": scores["fuzzy"]["mean"],
    }


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    from bench.machine import write_result

    commands = [
        ["envace", "data", "export-real", "--env", "agentdojo", "--split", "train",
         "--out", "train.jsonl"],
        ["envace", "data", "export-real", "--env", "agentdojo", "--split", "dev",
         "--out", "dev.jsonl"],
        ["envace", "data", "export-real", "--env", "agentdojo", "--split", "all",
         "--out", "all.jsonl"],
        ["envace-audit", "--quiet", "replay", "all.jsonl", "--out", "replay_all"],
    ] + [["envace-audit", "--quiet", "baseline", "dev.jsonl", "--reference", "train.jsonl",
          "--model", m, "--out", f"baseline_{m}"] for m in ("lookup", "majority")]
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for cmd in commands:
            run(cmd, tmp)
        load = lambda d: json.loads((Path(tmp) / d / AUDIT.summary).read_text())  # noqa: E731
        replay = load("replay_all")
        refs = {m: figures(load(f"baseline_{m}")) for m in ("lookup", "majority")}
    from envace.core.envs.agentdojo_tasks import DEFAULT_VERSION

    data = {
        "agentdojo_version": DEFAULT_VERSION,
        "commands": [" ".join(c) for c in commands],
        "determinism_check": {"steps": replay["counts"]["steps"],
                              "diverged": replay["counts"]["diverged"]},
        "dev": refs,
        "seconds": round(time.time() - start, 1),
        "note": "references built from the train split's real trajectories and scored on the "
                "dev split's ground-truth steps; exact = share rehearsed exactly (canonical)",
    }
    path = write_result("agentdojo_references", data)
    print(json.dumps(data["dev"], indent=1))
    print(f"-> {path}")


if __name__ == "__main__":
    main()
