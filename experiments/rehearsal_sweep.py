"""Test-time rehearsal sweep, reported as the paper's table is: N = 0..3 x {parallel,
sequential} x {base, trained} on dev, with 95 % intervals and the tokens each setting spent.

    .venv/bin/python -m experiments.rehearsal_sweep --models base=PATH trained=PATH [--tasks 30]
        [--name rehearsal_sweep_tiny] [--max-n 3] [--reward action_partial] [--resume]
        [--worlds self hybrid oracle] [--strategies parallel sequential] [--seed 0]

Every setting evaluates the same dev tasks (per-turn) with the same seeds; success is BFCL's
state check of the committed calls, reward the chosen task reward of the commit (denser than
success at small scale). Each rehearsal setting is compared with the same model's no-rehearsal
run task by task: the paired bootstrap 95 % interval of the reward difference. Results are
rewritten after every setting (bench/results/<name>.json), so a stopped sweep keeps what it ran;
``--resume`` reads that file back and runs only the settings it lacks (same tasks and lengths).
``--worlds`` says who answers the plans' calls (``envace.model.rehearsal.WORLDS``): the policy
(``self``, the method), the ``hybrid`` (the lookup's exact train-split answer where it has one,
the policy elsewhere), the ``ranker`` (``audit.worlds.ranker``: the learned pick among the train
split's real responses and their copy-edits) or the ``oracle`` (a private copy of the real
environment per plan: what a perfect world model would give the commit, an upper bound).
Every world is compared with the same no-rehearsal run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from audit.worlds.memory import ResponseMemory
from bench.machine import RESULTS, run_record, table, write_result
from envace.evaluation.evaluate import select_tasks
from envace.evaluation.rehearsal_eval import evaluate_with_rehearsal
from envace.model.models import load_model
from envace.model.rehearsal import WORLDS, RehearsalSettings


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", required=True, help="label=path")
    ap.add_argument("--tasks", type=int, default=30)
    ap.add_argument("--max-n", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--reward", default="action_partial")
    ap.add_argument("--name", default="rehearsal_sweep")
    ap.add_argument("--worlds", nargs="+", default=["self"], choices=list(WORLDS),
                    help="who answers the plans' calls, each a row set beside one shared "
                         "no-rehearsal run: self (the policy; the method), hybrid (the train "
                         "split's lookup where it has the exact call, the policy elsewhere), "
                         "oracle (a private copy of the real environment: an upper bound)")
    ap.add_argument("--strategies", nargs="+", default=["parallel", "sequential"],
                    choices=["parallel", "sequential"], help="rehearsal strategies to run")
    ap.add_argument("--seed", type=int, default=0,
                    help="sampling seed of plans and commits (the tasks stay the same)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the settings already in bench/results/<name>.json, run the rest")
    ap.add_argument("--keep", default=None,
                    help="write each setting's plans, commits and audits under this folder "
                         "(default: a temporary folder)")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    out = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="envace-sweep-"))
    rows, res = [], {"tasks": args.tasks, "reward": args.reward, "max_turns": args.max_turns,
                     "max_new_tokens": args.max_new_tokens, "seed": args.seed, "settings": {}}
    lookups: dict[str, Any] = {}
    if "hybrid" in args.worlds:
        lookups["hybrid"] = ResponseMemory.from_train_split("bfcl")
    if "ranker" in args.worlds:
        from audit.worlds.ranker import Ranker

        lookups["ranker"] = Ranker.from_train_split("bfcl")
    if args.resume:
        res["settings"] = previous_settings(args.name, res)
    head = ["model", "strategy", "N", "world", "success", "95% CI", f"{args.reward} reward",
            "diff vs N=0 (95% CI)", "rehearsal tokens/task", "rehearsal divergence"]
    for spec in args.models:
        label, path = spec.split("=", 1)
        model, tok = load_model(path)
        tasks = select_tasks("dev", "turn", args.tasks, tok, 4096, args.max_new_tokens, 0)
        grid = [("none", 0, "self")] + [(s, n, w) for w in args.worlds
                                        for s in args.strategies
                                        for n in range(1, args.max_n + 1)]
        for strategy, n, world in grid:
            key = setting_key(label, strategy, n, world)
            if key in res["settings"]:
                r = res["settings"][key]
                print(f"{key}: kept from the previous run", flush=True)
            else:
                s = RehearsalSettings(strategy=strategy, n=n,
                                      max_new_tokens=args.max_new_tokens,
                                      max_turns=args.max_turns, seed=args.seed, world=world,
                                      lookup=lookups.get(world))
                r = evaluate_with_rehearsal(model, tok, tasks, s,
                                            out / key.replace("/", "-"),
                                            reward=args.reward, model_name=path)
                res["settings"][key] = {k: r[k] for k in (
                    "success_rate", "success_ci", "attempts", "reward_mean", "per_attempt",
                    "budget", "rehearsal_audit", "fidelity_vs_success")}
                res["settings"][key].update(model=path, world=world)
            diff = None
            if strategy != "none":
                base = res["settings"][f"{label}/none/0"]["per_attempt"]
                diff = paired_diff_ci([a["reward"] for a in base],
                                      [a["reward"] for a in r["per_attempt"]])
                res["settings"][key]["reward_diff_vs_none"] = diff
            ci = r["success_ci"]
            div = (r["rehearsal_audit"] or {}).get("divergence_rate")
            rows.append([label, strategy, n, world, f"{r['success_rate']:.1%}",
                         f"[{ci[0]:.1%}, {ci[1]:.1%}]", f"{r['reward_mean']:.3f}",
                         "–" if diff is None else
                         f"{diff['mean']:+.3f} [{diff['ci'][0]:+.3f}, {diff['ci'][1]:+.3f}]",
                         round(r["budget"].get("rehearsal_tokens", 0)),
                         "–" if div is None else f"{div:.1%}"])
            print(table(rows[-1:], head), flush=True)
            write_result(args.name, {**res, **run_record("experiments.rehearsal_sweep", argv,
                                                          load_start)})
    print(table(rows, head))
    print("->", write_result(args.name, {**res, **run_record("experiments.rehearsal_sweep", argv,
                                                              load_start)}))


def previous_settings(name: str, want: dict[str, Any]) -> dict[str, Any]:
    """The settings of an earlier run of this sweep, refused if it measured something else."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    differ = [k for k in ("tasks", "reward", "max_turns", "max_new_tokens", "seed")
              if old.get(k, 0 if k == "seed" else None) != want[k]]
    if differ:
        raise SystemExit(f"--resume: {path} was made with other settings ("
                         + ", ".join(f"{k}={old.get(k)!r}" for k in differ)
                         + "); pass the same values or another --name")
    return dict(old.get("settings") or {})


def setting_key(label: str, strategy: str, n: int, world: str = "self") -> str:
    """``label/strategy/N`` (the policy's own rehearsal, the keys of every earlier sweep), with
    ``/world`` after it for another world (``none`` is shared: it rehearses nothing)."""
    key = f"{label}/{strategy}/{n}"
    return key if world == "self" or strategy == "none" else f"{key}/{world}"


def paired_diff_ci(a: list[float], b: list[float], n_boot: int = 5000, seed: int = 0
                   ) -> dict[str, Any]:
    """Mean of b - a over paired attempts and its percentile-bootstrap 95 % interval."""
    d = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    boots = d[np.random.default_rng(seed).integers(0, len(d), (n_boot, len(d)))].mean(axis=1)
    return {"mean": float(d.mean()),
            "ci": [float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))]}


if __name__ == "__main__":
    main()
