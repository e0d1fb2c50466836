"""Is learning real? Re-evaluate a run's starting point and its final policy with many samples.

    .venv/bin/python -m experiments.learning_reeval --runs runs/pool2-envace runs/pool2-grpo \
        --seeds 8 --name learning_tiny_pool

A run's own final evaluation draws ``eval_seeds`` samples per task; with a few dozen tasks and a
reward that is mostly 0 the interval of the difference is then wide. This evaluates, on the run's
evaluation tasks (``eval_split``; with ``train_tasks`` the training pool itself), the model the
run started from and its last checkpoint, ``--seeds`` samples per task each (same seeds for both),
and reports the mean reward and success of each, with the paired
bootstrap 95 % interval of the per-task difference. Also: the training reward of the first and
last third of the steps. Several runs of one mode (seeds) are also summarised together under
``across_runs``: a t interval over the runs' mean differences (``experiments.claims.across_seeds``).
Writes bench/results/<name>.json, after every run.

``--conditions eval`` (default): as the run's own evaluation, in the real environment at the
evaluation temperature. ``--conditions train``: as its training rollouts were drawn (``envace`` /
``split``: the policy rehearses the responses; ``grpo``: the real environment answers) at the
training temperature and top-p, fresh samples: the held-out counterpart of the training reward.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from bench.machine import run_record, table, write_result
from envace.core.layout import RUN
from envace.evaluation.evaluate import EvalSettings, evaluate
from envace.model.models import load_model
from envace.training.config import TrainConfig, load_config
from envace.training.train_report import eval_tasks
from experiments.claims import across_seeds
from experiments.learning import boot_diff, paired_ci, step_rewards


def per_task(out: Path) -> dict[str, tuple[float, float]]:
    acc: dict[str, list[tuple[float, bool]]] = {}
    for line in (out / RUN.eval_trajectories).read_text().splitlines():
        r = json.loads(line)
        acc.setdefault(r["task_id"], []).append(
            (float(r.get("reward") or 0.0), bool(r["meta"].get("success"))))
    return {t: (float(np.mean([x[0] for x in v])), float(np.mean([x[1] for x in v])))
            for t, v in acc.items()}


def last_checkpoint(run: Path) -> Path:
    steps = sorted((run / RUN.checkpoints).glob("step_*"), key=lambda p: int(p.name[5:]))
    return steps[-1] / "policy"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--name", default="learning_tiny_pool")
    ap.add_argument("--conditions", choices=["eval", "train"], default="eval",
                    help="sample as the run's evaluation did (real environment, evaluation "
                         "temperature) or as its training rollouts were drawn")
    args = ap.parse_args()
    load_start = os.getloadavg()
    out = Path(tempfile.mkdtemp(prefix="envace-reeval-"))
    res, rows = {"seeds": args.seeds, "conditions": args.conditions, "runs": {}}, []
    diffs: dict[str, dict[str, list[list[float]]]] = {}
    for run in map(Path, args.runs):
        cfg = load_config(TrainConfig, run / RUN.config, [], drop_removed=True)
        s = settings(cfg, args.seeds, args.conditions)
        found = {}
        for label, path in (("start", Path(cfg.model)), ("trained", last_checkpoint(run))):
            model, tok = load_model(path)
            tasks = eval_tasks(cfg, tok)
            evaluate(model, tok, tasks, out / run.name / label, s, label=label)
            found[label] = per_task(out / run.name / label)
        a, b = found["start"], found["trained"]
        tasks = sorted(set(a) & set(b))
        ra, rb = [a[t][0] for t in tasks], [b[t][0] for t in tasks]
        sa, sb = [a[t][1] for t in tasks], [b[t][1] for t in tasks]
        per_step = step_rewards(run)
        k = max(1, len(per_step) // 3)
        first = [r for step in per_step[:k] for r in step]
        last = [r for step in per_step[-k:] for r in step]
        r = {"mode": cfg.mode, "sampled_as": {"mode": s.mode, "temperature": s.temperature,
                                              "top_p": s.top_p},
             "reward": cfg.reward, "lr": cfg.lr, "steps": len(per_step),
             "eval_split": cfg.eval_split, "train_tasks": cfg.train_tasks,
             "tasks": len(tasks), "attempts_per_model": len(tasks) * args.seeds,
             "checkpoint": str(last_checkpoint(run)),
             "reward_start": float(np.mean(ra)), "reward_trained": float(np.mean(rb)),
             "reward_diff_ci": paired_ci(ra, rb),
             "success_start": float(np.mean(sa)), "success_trained": float(np.mean(sb)),
             "success_diff_ci": paired_ci(sa, sb),
             "train_reward_first_third": float(np.mean(first)),
             "train_reward_last_third": float(np.mean(last)),
             "train_reward_diff_ci": boot_diff(first, last)}
        res["runs"][str(run)] = r
        # runs of one mode (seeds) together: a t interval over the runs' mean differences
        d = diffs.setdefault(cfg.mode, {"reward": [], "success": []})
        d["reward"].append([y - x for x, y in zip(ra, rb, strict=True)])
        d["success"].append([y - x for x, y in zip(sa, sb, strict=True)])
        res["across_runs"] = {m: {k: across_seeds(v) for k, v in dm.items()}
                              for m, dm in diffs.items() if len(dm["reward"]) > 1}
        ci, sci = r["reward_diff_ci"], r["success_diff_ci"]
        rows.append([run.name, r["mode"], r["tasks"], args.seeds,
                     f"{r['reward_start']:.3f} -> {r['reward_trained']:.3f}",
                     f"[{ci[0]:+.3f}, {ci[1]:+.3f}]",
                     f"{r['success_start']:.1%} -> {r['success_trained']:.1%}",
                     f"[{sci[0]:+.1%}, {sci[1]:+.1%}]"])
        print(table(rows[-1:], HEAD), flush=True)
        # written after every run: a long sweep that dies keeps the runs it finished
        path = write_result(args.name, {**res, **run_record("experiments.learning_reeval", None,
                                                              load_start)})
    print(table(rows, HEAD))
    for m, a in res.get("across_runs", {}).items():
        print(f"{m}, {a['reward']['seeds']} runs ({a['reward']['interval']}): reward difference "
              f"{_ci(a['reward'], '+.3f')}, success {_ci(a['success'], '+.1%')}")
    print("->", path)


def _ci(ci: dict, fmt: str) -> str:
    if ci["lo"] is None:
        return format(ci["mean"], fmt)
    return f"{ci['mean']:{fmt}} [{ci['lo']:{fmt}}, {ci['hi']:{fmt}}]"


def settings(cfg: TrainConfig, seeds: int, conditions: str) -> EvalSettings:
    """How to sample: as the run's evaluation, or as its training rollouts."""
    from envace.core.modes import training_mode

    common = dict(seeds=seeds, max_new_tokens=cfg.max_new_tokens, max_turns=cfg.max_turns,
                  max_context=cfg.max_context_tokens, reward=cfg.reward,
                  desc_chars=cfg.desc_chars)
    if conditions == "train":
        mode = training_mode(cfg.mode).rollout
        if mode == "simulator":
            raise SystemExit("--conditions train: simulator runs need their simulator; use eval")
        return EvalSettings(temperature=cfg.temperature, top_p=cfg.top_p, mode=mode, **common)
    return EvalSettings(temperature=cfg.eval_temperature, top_p=cfg.eval_top_p, mode="real",
                        **common)


HEAD = ["run", "mode", "tasks", "samples/task", "reward start -> trained", "diff 95% CI",
        "success", "diff 95% CI"]


if __name__ == "__main__":
    main()
