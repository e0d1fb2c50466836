"""Is learning real? Compare trained runs with their starting point on the same dev tasks.

    .venv/bin/python -m experiments.learning --base runs/learn2-base \
        --runs runs/learn2-envace runs/learn2-grpo runs/learn2-split

Each run directory holds the final evaluation on dev (``eval/dev/trajectories.jsonl``: reward and
success per task, same tasks in every run: ``eval_tasks`` is sampled with the run's seed), the
rehearsed evaluation's audit (``eval/dev_rehearsed/audit/summary.json``: how often the model's
own rehearsed responses diverge from reality; rehearsed steps only, trajectory-bootstrap
interval) and the per-step training rollouts (``rollouts/step_*.jsonl``, reward per episode).
Reports, per run: dev reward and success with the paired bootstrap interval of the difference
from the base (over tasks), dev fidelity, and the training reward of the first and last third
of the steps with a bootstrap interval of the difference (over episodes).
Writes bench/results/<--name>.json.

The runs are made with the project's own commands (docs/results.md, "Learning (tiny preset)").
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from bench.machine import run_record, table, write_result
from envace.core.layout import AUDIT, RUN


def eval_split(run: Path) -> str:
    import yaml

    return (yaml.safe_load((run / RUN.config).read_text()) or {}).get("eval_split", "dev")


def per_task(run: Path) -> dict[str, tuple[float, float]]:
    """Mean reward and success per evaluated task (over its samples, ``eval_seeds``)."""
    acc: dict[str, list[tuple[float, bool]]] = {}
    path = RUN.eval_dir(run, eval_split(run)) / RUN.eval_trajectories
    for line in path.read_text().splitlines():
        r = json.loads(line)
        acc.setdefault(r["task_id"], []).append(
            (float(r.get("reward") or 0.0), bool(r["meta"].get("success"))))
    return {t: (float(np.mean([x[0] for x in v])), float(np.mean([x[1] for x in v])))
            for t, v in acc.items()}


def paired_ci(a: list[float], b: list[float], n_boot: int = 5000, seed: int = 0) -> list[float]:
    d = np.asarray(b) - np.asarray(a)
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, len(d), (n_boot, len(d)))].mean(axis=1)
    return [float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))]


def boot_diff(a: list[float], b: list[float], n_boot: int = 5000, seed: int = 0) -> list[float]:
    """95 % interval of mean(b) - mean(a), resampling each side on its own (unpaired)."""
    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(a), np.asarray(b)
    d = (xb[rng.integers(0, len(xb), (n_boot, len(xb)))].mean(1)
         - xa[rng.integers(0, len(xa), (n_boot, len(xa)))].mean(1))
    return [float(np.quantile(d, 0.025)), float(np.quantile(d, 0.975))]


def step_rewards(run: Path) -> list[list[float]]:
    out = []
    files = sorted((run / RUN.rollouts).glob("step_*.jsonl"), key=lambda f: int(f.stem[5:]))
    for f in files:
        out.append([float(json.loads(x).get("reward") or 0.0)
                    for x in f.read_text().splitlines() if x.strip()])
    return out


def fidelity(run: Path) -> dict:
    path = RUN.eval_dir(run, f"{eval_split(run)}_rehearsed") / RUN.audit / AUDIT.summary
    if not path.exists():
        return {}
    s = json.loads(path.read_text())
    if s.get("schema", "").endswith("/1"):  # older audits: the rehearsed block, Wilson on steps
        reh = (s.get("by_source") or {}).get("rehearsed") or {}
        return {"steps": reh.get("steps"), "divergence_rate": reh.get("divergence_rate"),
                "divergence_ci": reh.get("divergence_ci"), "interval": "wilson_steps"}
    if s.get("determinism_check"):  # nothing rehearsed
        return {}
    return {"steps": (s.get("counts") or {}).get("scored_steps"),
            "divergence_rate": s.get("divergence_rate"), "divergence_ci": s.get("divergence_ci"),
            "interval": (s.get("interval") or {}).get("method")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--name", default="learning_tiny", help="bench/results/<name>.json")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    base = per_task(Path(args.base))
    rows, rows2, res = [], [], {"base": args.base, "base_fidelity": fidelity(Path(args.base)),
                                "runs": {}}
    bf = res["base_fidelity"]
    rows2.append(["start (cold start)", 0, f"{np.mean([v[1] for v in base.values()]):.1%}",
                  f"{np.mean([v[0] for v in base.values()]):.3f}", _div(bf)])
    for run in args.runs:
        cur = per_task(Path(run))
        tasks = sorted(set(base) & set(cur))
        a = [base[t][0] for t in tasks]
        b = [cur[t][0] for t in tasks]
        sa = [base[t][1] for t in tasks]
        sb = [cur[t][1] for t in tasks]
        metrics = [json.loads(x) for x in (Path(run) / RUN.metrics).read_text().splitlines()]
        per_step = step_rewards(Path(run))
        k = max(1, len(per_step) // 3)
        first = [r for step in per_step[:k] for r in step]
        last = [r for step in per_step[-k:] for r in step]
        cfg = {}
        if (Path(run) / RUN.config).exists():
            import yaml

            cfg = yaml.safe_load((Path(run) / RUN.config).read_text())
        res["runs"][run] = {
            "mode": cfg.get("mode"), "reward": cfg.get("reward"), "lr": cfg.get("lr"),
            "eval_split": cfg.get("eval_split"), "train_tasks": cfg.get("train_tasks"),
            "eval_seeds": cfg.get("eval_seeds"),
            "tasks": len(tasks), "steps": len(metrics),
            "dev_reward_base": float(np.mean(a)), "dev_reward": float(np.mean(b)),
            "dev_reward_diff_ci": paired_ci(a, b),
            "dev_success_base": float(np.mean(sa)), "dev_success": float(np.mean(sb)),
            "dev_success_diff_ci": paired_ci(sa, sb),
            "dev_fidelity": fidelity(Path(run)),
            "train_reward_first_third": float(np.mean(first)),
            "train_reward_last_third": float(np.mean(last)),
            "train_reward_diff_ci": boot_diff(first, last),
            "train_reward_by_step": [float(np.mean(x)) for x in per_step],
            "train_divergence_by_step": [m.get("fidelity/divergence_rate") for m in metrics],
        }
        r = res["runs"][run]
        ci, tci = r["dev_reward_diff_ci"], r["train_reward_diff_ci"]
        rows.append([Path(run).name, len(tasks), f"{r['dev_reward_base']:.3f}",
                     f"{r['dev_reward']:.3f}", f"[{ci[0]:+.3f}, {ci[1]:+.3f}]",
                     f"{r['dev_success_base']:.1%} -> {r['dev_success']:.1%}",
                     f"{r['train_reward_first_third']:.3f} -> {r['train_reward_last_third']:.3f}",
                     f"[{tci[0]:+.3f}, {tci[1]:+.3f}]"])
        rows2.append([f"{r['mode']} ({Path(run).name})", len(metrics),
                      f"{r['dev_success']:.1%}", f"{r['dev_reward']:.3f}",
                      _div(r["dev_fidelity"])])
    print(table(rows, ["run", "eval tasks", "base reward", "trained reward", "diff 95% CI",
                       "eval success", "train reward first->last third", "diff 95% CI"]))
    print(table(rows2, ["policy", "steps", "eval success", "eval reward",
                        "rehearsed responses diverging (95% CI)"]))
    # the runs were measured when they trained: this process only reads them
    print("->", write_result(args.name, {
        **res, **run_record("experiments.learning", argv, load_start), "quiet_machine": None,
        "load_scope": "aggregation",
        "load_not_recorded": "the runs' own load is not in their directories (envace train "
                             "does not record it); this file's load_average is the reading's"}))


def _div(f: dict) -> str:
    if not f or f.get("divergence_rate") is None:
        return "–"
    ci = f.get("divergence_ci") or [float("nan")] * 2
    return f"{f['divergence_rate']:.1%} [{ci[0]:.1%}, {ci[1]:.1%}] of {f['steps']}"


if __name__ == "__main__":
    main()
