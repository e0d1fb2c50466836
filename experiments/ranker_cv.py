"""Benchmark: the learned ranker's settings, chosen on the train split alone (issue #17).

    .venv/bin/python -m experiments.ranker_cv --train runs/world_model_skill/data/train.jsonl

`audit.worlds.ranker` picks among real training responses and their copy-edits with a
gradient-boosted classifier. Its settings (``audit.worlds.ranker.BOOSTING``) were chosen here, by
5-fold cross-validation over the train split's scenarios (folds by
``audit.worlds.memory.scenario_key``, scenarios dealt in sorted order): each fold's calls are
answered by a ranker fitted on the other four folds' calls, every call's candidates drawn from the
other scenarios of the whole train file (the leave-scenario-out a held-out call sees). Per setting:
exact rate, ``edit``'s exact rate on the same calls (the first candidate of every call), and skill
against ``edit`` with the bootstrap interval resampling scenarios. Dev and test are never read.
Writes ``bench/results/<name>.json`` (machine, load, seconds) and prints the table. """

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from bench.machine import run_record, table, write_result

#: the settings compared (the first is audit.worlds.ranker.BOOSTING's, chosen by this table)
GRID: list[dict[str, Any]] = [
    {"max_iter": 200, "learning_rate": 0.05, "min_samples_leaf": 20},
    {"max_iter": 100, "learning_rate": 0.05, "min_samples_leaf": 20},
    {"max_iter": 400, "learning_rate": 0.05, "min_samples_leaf": 20},
    {"max_iter": 200, "learning_rate": 0.1, "max_depth": 3, "min_samples_leaf": 20},
    {"max_iter": 200, "learning_rate": 0.05, "max_depth": 4, "min_samples_leaf": 50},
    {"max_iter": 300, "learning_rate": 0.03, "max_depth": 6, "min_samples_leaf": 20},
]


def calls_with_candidates(train: str) -> list[dict[str, Any]]:
    """Every answered real call of `train` with its candidates' features and labels."""
    from audit.scoring.canonical import canonical_text
    from audit.worlds.memory import ResponseMemory, scenario_key
    from audit.worlds.ranker import candidate_rows, training_calls
    from envace.core.schema import read_trajectories

    memory = ResponseMemory.from_file(train)
    trajs = [i.trajectory for i in read_trajectories(train) if i.trajectory is not None]
    out = []
    for task, tool, args, history, real in training_calls(trajs):
        rows = candidate_rows(memory, tool, args, task, history)
        want = canonical_text(real)
        out.append({"scenario": scenario_key(task), "x": [f for *_, f in rows],
                    "y": [int(key == want) for key, *_ in rows]})
    return out


def cross_validate(calls: list[dict[str, Any]], setting: dict[str, Any],
                   folds: int = 5) -> dict[str, Any]:
    """Exact rates of the ranker and of ``edit`` (first candidate) over the held-out folds, and
    skill against ``edit`` with its scenario-bootstrap interval."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    from audit.worlds.reference import skill_with_ci

    scenarios = sorted({c["scenario"] for c in calls})
    fold = {s: i % folds for i, s in enumerate(scenarios)}
    model_right: list[float] = []
    edit_right: list[float] = []
    groups: list[str] = []
    for k in range(folds):
        fit = [c for c in calls if fold[c["scenario"]] != k]
        x = [f for c in fit for f in c["x"]]
        y = [v for c in fit for v in c["y"]]
        clf = HistGradientBoostingClassifier(early_stopping=False, random_state=0,
                                             **setting).fit(x, y)
        for c in calls:
            if fold[c["scenario"]] != k:
                continue
            groups.append(c["scenario"])
            if not c["x"]:
                model_right.append(0.0)
                edit_right.append(0.0)
                continue
            p = clf.predict_proba(c["x"])[:, 1]
            best = max(range(len(p)), key=lambda i: (p[i], -i))
            model_right.append(float(c["y"][best]))
            edit_right.append(float(c["y"][0]))
    s = skill_with_ci(model_right, edit_right, groups, n_boot=2000)
    return {"setting": setting, "calls": len(model_right), "exact": s["f_model"],
            "edit_exact": s["f_ref"], "skill_vs_edit": {k: s[k] for k in ("point", "lo", "hi")}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", default="runs/world_model_skill/data/train.jsonl",
                    help="the train split's real trajectories (envace data export-real)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--name", default="ranker_cv")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    calls = calls_with_candidates(args.train)
    results = [cross_validate(calls, s, args.folds) for s in GRID]
    rows = [[", ".join(f"{k}={v}" for k, v in r["setting"].items()), r["calls"],
             f"{r['exact']:.3f}", f"{r['edit_exact']:.3f}",
             f"{r['skill_vs_edit']['point']:+.3f} [{r['skill_vs_edit']['lo']:+.3f}, "
             f"{r['skill_vs_edit']['hi']:+.3f}]"] for r in results]
    header = ["setting", "calls", "exact", "edit exact", "skill vs edit (95 % CI, scenarios)"]
    print(table(rows, header))
    write_result(args.name, {**run_record("experiments.ranker_cv", argv, load_start),
                             "train": args.train, "folds": args.folds,
                             "seconds": time.perf_counter() - t0, "results": results,
                             "table": {"header": header, "rows": rows}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
