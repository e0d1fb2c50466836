"""Make the fixed train/dev/test split of the 800 BFCL multi-turn tasks, by scenario.

    .venv/bin/python scripts/make_splits.py   # writes data/splits/{train,dev,test}.txt, README.md

The four categories are variants of the same 200 scenarios, so all variants of a scenario go to
one split (140 train, 30 dev, 30 test scenarios), balanced greedily so that each backend appears
in each split in proportion (see ``assign``).
The README it writes reports the remaining overlap: held-out calls and (call, response) pairs that
appear verbatim in train.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from pathlib import Path

from envace.envs.tasks import CATEGORIES, load_tasks
from envace.export import real_trajectory

SEED = 0
PATTERN = ["train"] * 14 + ["dev"] * 3 + ["test"] * 3
SIZES = ("train", "dev", "test")
OUT = Path(__file__).resolve().parents[1] / "data" / "splits"


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
    seen_calls, seen_pairs = set(), set()
    steps = defaultdict(list)
    for split, lst in ids.items():
        for tid in lst:
            for st in real_trajectory(tasks[tid]).tool_steps():
                key = call_key(st.tool, st.arguments)
                steps[split].append((key, st.response.content))
                if split == "train":
                    seen_calls.add(key)
                    seen_pairs.add((key, st.response.content))
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
    (OUT / "README.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
