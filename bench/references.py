"""Benchmark: the reference world models on dev, the figures a learned world model has to beat.

    .venv/bin/python -m bench.references --env bfcl        # bench/results/bfcl_references.json
    .venv/bin/python -m bench.references --env agentdojo   # bench/results/agentdojo_references.json

Runs exactly the commands a user would (recorded in the result): export the train and dev
splits' real trajectories, replay every task of the environment (the determinism check: must be
0 % divergence), then ``envace-audit baseline`` for each reference (``lookup``, ``edit``,
``majority``; `audit.reference`) built from train and scored on dev's ground-truth calls. Each
reference's skill against the lookup is paired call by call, with an interval that resamples
whole trajectories (`audit.reference.skill_with_ci`).

``train_leave_scenario_out`` is the figure the ``edit`` rule was fixed on, before dev was
scored: every train call answered by the references built from the other train scenarios
(`audit.memory.scenario_key`: the four BFCL categories of one scenario go out together),
exact share and skill against the lookup with the interval resampling scenarios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from envace.core.layout import AUDIT

BIN = Path(sys.executable).parent
REFERENCES = ("lookup", "edit", "majority")


def run(cmd: list[str], cwd: str) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run([str(BIN / cmd[0]), *cmd[1:]], cwd=cwd, check=True)


def figures(summary: dict[str, Any]) -> dict[str, Any]:
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


def exact_by_step(steps_file: Path) -> dict[tuple[str, int], float]:
    """(trajectory id, step) -> exact score, from an audit's ``steps.jsonl``."""
    out = {}
    for line in steps_file.read_text().splitlines():
        row = json.loads(line)
        out[(row["trajectory_id"], row["step"])] = row["scores"]["exact"]
    return out


def paired_skill(model: dict[tuple[str, int], float],
                 ref: dict[tuple[str, int], float]) -> dict[str, Any]:
    """Skill of `model` against `ref` on the calls both scored, intervals by trajectory."""
    from audit.reference import skill_with_ci

    keys = sorted(model.keys() & ref.keys())
    if len(keys) != len(model) or len(keys) != len(ref):
        raise ValueError("the two audits scored different calls")
    return skill_with_ci([model[k] for k in keys], [ref[k] for k in keys],
                         groups=[k[0] for k in keys])


def leave_scenario_out(train_file: Path, names: tuple[str, ...] = REFERENCES) -> dict[str, Any]:
    """Each train call answered by each reference built from the other scenarios' calls."""
    from audit.canonical import canonical_text
    from audit.memory import ResponseMemory, scenario_key
    from audit.reference import build_reference, skill_with_ci

    entries = ResponseMemory.from_file(train_file).entries
    keys = [scenario_key(e.task_id) for e in entries]
    by_scenario: dict[str, list] = {}
    for e, key in zip(entries, keys, strict=True):
        by_scenario.setdefault(key, []).append(e)
    hits: dict[str, list[float]] = {m: [] for m in names}
    groups: list[str] = []
    for scen, held in by_scenario.items():
        rest = [(e.tool, e.arguments, e.response) for e, key in zip(entries, keys, strict=True)
                if key != scen]
        refs = {m: build_reference(m, rest) for m in names}
        for e in held:
            groups.append(scen)
            for m in names:
                same = canonical_text(refs[m](e.tool, e.arguments)) == canonical_text(e.response)
                hits[m].append(1.0 if same else 0.0)
    out: dict[str, Any] = {"calls": len(groups), "scenarios": len(by_scenario)}
    for m in names:
        sk = skill_with_ci(hits[m], hits["lookup"], groups=groups)
        out[m] = {"exact": sum(hits[m]) / len(groups),
                  "skill_vs_lookup": {k: sk[k] for k in ("point", "lo", "hi")}}
    return out


def commands_for(env: str) -> list[list[str]]:
    export = ["envace", "data", "export-real", "--env", env]
    return [
        [*export, "--split", "train", "--out", "train.jsonl"],
        [*export, "--split", "dev", "--out", "dev.jsonl"],
        [*export, "--split", "all", "--out", "all.jsonl"],
        ["envace-audit", "--quiet", "replay", "all.jsonl", "--out", "replay_all"],
    ] + [["envace-audit", "--quiet", "baseline", "dev.jsonl", "--reference", "train.jsonl",
          "--model", m, "--out", f"baseline_{m}"] for m in REFERENCES]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", choices=["bfcl", "agentdojo"], default="bfcl")
    args = ap.parse_args(argv)
    from bench.machine import write_result

    commands = commands_for(args.env)
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for cmd in commands:
            run(cmd, tmp)
        load = lambda d: json.loads((Path(tmp) / d / AUDIT.summary).read_text())  # noqa: E731
        replay = load("replay_all")
        refs = {m: figures(load(f"baseline_{m}")) for m in REFERENCES}
        steps = {m: exact_by_step(Path(tmp) / f"baseline_{m}" / AUDIT.steps) for m in REFERENCES}
        for m in REFERENCES:
            sk = paired_skill(steps[m], steps["lookup"])
            refs[m]["skill_vs_lookup"] = {k: sk[k] for k in ("point", "lo", "hi")}
        loso = leave_scenario_out(Path(tmp) / "train.jsonl")
    data: dict[str, Any] = {"env": args.env}
    if args.env == "agentdojo":
        from envace.core.envs.agentdojo_tasks import DEFAULT_VERSION

        data["agentdojo_version"] = DEFAULT_VERSION
    data.update({
        "commands": [" ".join(c) for c in commands],
        "determinism_check": {"steps": replay["counts"]["steps"],
                              "diverged": replay["counts"]["diverged"]},
        "dev": refs,
        "train_leave_scenario_out": loso,
        "seconds": round(time.time() - start, 1),
        "note": "references built from the train split's real trajectories and scored on the "
                "dev split's ground-truth steps; exact = share rehearsed exactly (canonical); "
                "skill_vs_lookup paired call by call, 95 % interval resampling trajectories",
    })
    path = write_result(f"{args.env}_references", data)
    print(json.dumps(data["dev"], indent=1))
    print(f"-> {path}")


if __name__ == "__main__":
    main()
