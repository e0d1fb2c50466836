"""The committed splits: by scenario, complete, deterministic, balanced by backend."""

from __future__ import annotations

from collections import Counter

from envace.core.envs.bfcl.tasks import load_tasks, split_ids


def test_no_scenario_crosses_splits_and_all_tasks_covered():
    tasks = load_tasks()
    seen: dict[int, str] = {}
    total = 0
    for split in ("train", "dev", "test"):
        ids = split_ids(split)
        total += len(ids)
        for tid in ids:
            s = tasks[tid].scenario
            assert seen.setdefault(s, split) == split, f"scenario {s} in {seen[s]} and {split}"
    assert total == 800 and len(seen) == 200


def test_splits_are_reproducible_from_the_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "make_splits.py"
    spec = importlib.util.spec_from_file_location("make_splits", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assignment = mod.assign()
    tasks = load_tasks()
    for split in ("train", "dev", "test"):
        assert {tasks[t].scenario for t in split_ids(split)} == {
            s for s, v in assignment.items() if v == split}


def test_backends_balanced():
    tasks = load_tasks()
    counts = {sp: Counter(b for t in split_ids(sp) for b in tasks[t].involved_classes)
              for sp in ("train", "dev", "test")}
    for backend, n_train in counts["train"].items():
        for held in ("dev", "test"):
            share = counts[held][backend] / max(n_train, 1)
            assert 0.05 < share < 0.5, (backend, held, share)
