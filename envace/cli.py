"""The `envace` command.

    envace data export-real --split dev --out dev.jsonl     real trajectories (ground truth run)
    envace data splits                                     split sizes and overlap note
    envace sft --preset tiny                               cold start (trl SFTTrainer)
    envace rollout --model PATH --split dev --mode rehearse --out FILE.jsonl
    envace train [--config configs/tiny.yaml] [key=value ...] [--resume runs/NAME]

Heavy modules (torch, transformers) are imported only by the subcommands that need them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from envace.envs.tasks import CATEGORIES, SPLITS


def _cmd_export_real(args: argparse.Namespace) -> int:
    from envace.envs.tasks import UnknownTask, get_task, split_tasks
    from envace.export import export_real
    from envace.schema import TrajectoryWriter

    if args.tasks:
        try:
            tasks = [get_task(t) for t in args.tasks]
        except UnknownTask as exc:
            print(f"envace: {exc}", file=sys.stderr)
            return 2
    else:
        tasks = split_tasks(args.split, tuple(args.categories))
    n = 0
    with TrajectoryWriter(args.out, mode="w") as w:
        for traj in export_real(tasks, turn_end=not args.no_turn_end):
            w.write(traj)
            n += 1
    print(f"wrote {n} real trajectories to {args.out}")
    return 0


def _cmd_splits(args: argparse.Namespace) -> int:
    from envace.envs.tasks import DATA_DIR

    print((DATA_DIR / "splits" / "README.md").read_text())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="envace", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="tasks, splits and real trajectories")
    dsub = data.add_subparsers(dest="data_command", required=True)
    ex = dsub.add_parser("export-real", help="execute ground truth, write real trajectories")
    ex.add_argument("--split", choices=SPLITS, default="dev")
    ex.add_argument("--categories", nargs="+", choices=CATEGORIES, default=list(CATEGORIES))
    ex.add_argument("--tasks", nargs="+", help="explicit task ids instead of a split")
    ex.add_argument("--out", required=True, help="output .jsonl")
    ex.add_argument("--no-turn-end", action="store_true",
                    help="omit the empty assistant message that closes each turn")
    ex.set_defaults(func=_cmd_export_real)
    sp = dsub.add_parser("splits", help="print the split note")
    sp.set_defaults(func=_cmd_splits)

    for name, module in _EXTRA.items():
        try:
            mod = __import__(module, fromlist=["add_parser"])
        except ImportError:
            continue
        mod.add_parser(sub, name)
    return p


# Subcommands defined next to their code: each module exposes add_parser(subparsers, name).
_EXTRA: dict[str, str] = {
    "sft": "envace.sft_cli",
    "rollout": "envace.rollout_cli",
    "train": "envace.train_cli",
    "eval": "envace.eval_cli",
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may come after options (`envace train --quiet lr=1e-5 steps=3`)
    if extra and hasattr(args, "overrides") and all(
            "=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    raise SystemExit(main())
