"""Is learning real? Compare trained runs with their starting point on the same dev tasks.

    .venv/bin/python -m bench.learning --base runs/learn-base \
        --runs runs/learn-envace runs/learn-grpo

Each run directory holds the final evaluation on dev (``eval/dev/trajectories.jsonl``: reward and
success per task, same tasks in every run: ``eval_tasks`` is sampled with the run's seed) and the
per-step training reward (``metrics.jsonl``). Reports, per run: dev reward and success with the
paired bootstrap interval of the difference from the base (over tasks), and the training reward
of the first and last steps. Writes bench/results/learning_tiny.json.

The runs are made with the project's own commands (README, "Learning at the tiny scale").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench.machine import table, write_result


def per_task(run: Path) -> dict[str, tuple[float, bool]]:
    out = {}
    for line in (run / "eval" / "dev" / "trajectories.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[r["task_id"]] = (float(r.get("reward") or 0.0), bool(r["meta"].get("success")))
    return out


def paired_ci(a: list[float], b: list[float], n_boot: int = 5000, seed: int = 0) -> list[float]:
    d = np.asarray(b) - np.asarray(a)
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, len(d), (n_boot, len(d)))].mean(axis=1)
    return [float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--runs", nargs="+", required=True)
    args = ap.parse_args()
    base = per_task(Path(args.base))
    rows, res = [], {"base": args.base, "runs": {}}
    for run in args.runs:
        cur = per_task(Path(run))
        tasks = sorted(set(base) & set(cur))
        a = [base[t][0] for t in tasks]
        b = [cur[t][0] for t in tasks]
        sa = [float(base[t][1]) for t in tasks]
        sb = [float(cur[t][1]) for t in tasks]
        metrics = [json.loads(x) for x in (Path(run) / "metrics.jsonl").read_text().splitlines()]
        k = max(1, len(metrics) // 3)
        first = float(np.mean([m["reward/mean"] for m in metrics[:k]]))
        last = float(np.mean([m["reward/mean"] for m in metrics[-k:]]))
        div = [m.get("fidelity/divergence_rate") for m in metrics]
        res["runs"][run] = {
            "tasks": len(tasks), "steps": len(metrics),
            "dev_reward_base": float(np.mean(a)), "dev_reward": float(np.mean(b)),
            "dev_reward_diff_ci": paired_ci(a, b),
            "dev_success_base": float(np.mean(sa)), "dev_success": float(np.mean(sb)),
            "dev_success_diff_ci": paired_ci(sa, sb),
            "train_reward_first_third": first, "train_reward_last_third": last,
            "train_divergence_by_step": div,
        }
        r = res["runs"][run]
        ci = r["dev_reward_diff_ci"]
        rows.append([Path(run).name, len(tasks), f"{r['dev_reward_base']:.3f}",
                     f"{r['dev_reward']:.3f}", f"[{ci[0]:+.3f}, {ci[1]:+.3f}]",
                     f"{r['dev_success_base']:.1%} -> {r['dev_success']:.1%}",
                     f"{first:.3f} -> {last:.3f}"])
    print(table(rows, ["run", "dev tasks", "base reward", "trained reward", "diff 95% CI",
                       "dev success", "train reward first->last third"]))
    print("->", write_result("learning_tiny", res))


if __name__ == "__main__":
    main()
