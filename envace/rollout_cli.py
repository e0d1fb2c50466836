"""`envace rollout`: episodes in the trajectory format, ready for `envace-audit replay`.

    envace rollout --model PATH --split dev --mode rehearse --out dev_rollouts.jsonl
        [--tasks 20] [--unit turn|task] [--temperature 0.6] [--simulator PATH_OR_URL]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="run episodes and write trajectories", description=__doc__)
    p.add_argument("--model", required=True, help="tiny, smollm2 or a local model folder")
    p.add_argument("--split", default="dev", choices=["train", "dev", "test"])
    p.add_argument("--mode", default="rehearse", choices=["rehearse", "real", "simulator"])
    p.add_argument("--simulator", help="mode simulator: a model folder/preset or an http(s) URL")
    p.add_argument("--out", required=True)
    p.add_argument("--tasks", type=int, default=0, help="at most this many tasks (0: all)")
    p.add_argument("--unit", default="turn", choices=["turn", "task"])
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--max-context", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from envace.config import TrainConfig
    from envace.envs.tasks import split_tasks
    from envace.models import default_cache_dir, load_model, resolve_model
    from envace.rewards import task_reward
    from envace.rollout import RolloutConfig, run_episodes
    from envace.schema import TrajectoryWriter
    from envace.train_setup import fitting_tasks, make_simulator
    from envace.turns import turn_tasks

    if args.mode == "simulator" and not args.simulator:
        print("envace rollout: --mode simulator needs --simulator PATH_OR_URL", file=sys.stderr)
        return 2
    try:
        path = resolve_model(args.model, default_cache_dir()) if args.model != "tiny" else None
    except ValueError as exc:
        print(f"envace rollout: {exc}", file=sys.stderr)
        return 2
    if path is None:
        print("envace rollout: give a trained model folder (e.g. runs/<run>/checkpoints/...)",
              file=sys.stderr)
        return 2
    model, tok = load_model(path)
    cfg = TrainConfig(model=str(path), max_new_tokens=args.max_new_tokens,
                      max_context_tokens=args.max_context)
    tasks = split_tasks(args.split)
    tasks = turn_tasks(tasks) if args.unit == "turn" else tasks
    tasks = fitting_tasks(tasks, tok, cfg)
    if args.tasks and len(tasks) > args.tasks:
        tasks = random.Random(args.seed).sample(tasks, args.tasks)
    sim = None
    if args.mode == "simulator":
        cfg.simulator_model = args.simulator
        sim = make_simulator(cfg)
    rcfg = RolloutConfig(mode=args.mode, temperature=args.temperature, top_p=args.top_p,
                         max_new_tokens=args.max_new_tokens, max_turns=args.max_turns,
                         max_context=args.max_context, seed=args.seed)
    n = 0
    with TrajectoryWriter(Path(args.out), mode="w") as w:
        for i in range(0, len(tasks), args.batch_size):
            for ep in run_episodes(model, tok, tasks[i:i + args.batch_size], rcfg, sim):
                r = task_reward("state", ep.task, ep.calls_per_turn)
                ep.trajectory.reward = float(r["success"])
                ep.trajectory.model = str(path)
                w.write(ep.trajectory)
                n += 1
    print(f"wrote {n} {args.mode} trajectories to {args.out}")
    return 0
