"""`envace sft`: the cold start from the command line (see `envace.training.sft`).

    envace sft --preset tiny
    envace sft --preset smollm2 --max-minutes 10 --out runs/sft-smollm2
    envace sft --preset runs/sft-tiny --roles act --max-steps 100 --lr 3e-4
    envace sft --config configs/sft_tiny.yaml seed=1
    envace sft --preset data/models/tiny-sft --roles rehearse --memory-k 3
    envace sft --preset smollm2 --env tau2 --roles rehearse --max-minutes 20

Flags set the common fields; `key=value` words set any field of `SFTSettings`
(`envace sft --help-config` lists them). Torch is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from envace.core.text import terminal_safe

# flag -> SFTSettings field
_FLAGS = {
    "preset": "preset", "out": "out", "roles": "roles", "max_minutes": "max_minutes",
    "max_steps": "max_steps", "lr": "lr", "seq_len": "seq_len", "batch_size": "batch_size",
    "epochs": "epochs", "seed": "seed", "data": "data", "force": "force", "threads": "threads",
    "memory_k": "memory_k", "env": "env",
}


def add_parser(subparsers: Any, name: str) -> argparse.ArgumentParser:
    p = subparsers.add_parser(name, help="cold start: SFT on real train trajectories (trl)",
                              description=__doc__.split("\n")[0])
    p.add_argument("--preset", help="tiny, smollm2 or a model folder (default tiny)")
    p.add_argument("--out", help="output folder (default under the cache dir)")
    p.add_argument("--roles", choices=["both", "act", "rehearse"],
                   help="trained roles: both, act only, or rehearse only (default both)")
    p.add_argument("--max-minutes", type=float, help="time budget of the whole command (9)")
    p.add_argument("--max-steps", type=int, help="optimizer steps (0 = until budget / epochs)")
    p.add_argument("--lr", type=float, help="peak learning rate (preset default)")
    p.add_argument("--seq-len", type=int, help="tokens per window (preset default)")
    p.add_argument("--batch-size", type=int, help="windows per step (preset default)")
    p.add_argument("--epochs", type=float, help="passes over the data (3)")
    p.add_argument("--seed", type=int)
    p.add_argument("--memory-k", type=int,
                   help="before each tool response, a note of the K most similar real training "
                   "calls (other scenarios only), as `envace probe --memory` shows (0 = off)")
    p.add_argument("--threads", type=int, help="torch CPU threads (0 = auto from the load)")
    p.add_argument("--data", help="a trajectory JSONL to train on instead of the train split")
    p.add_argument("--env", help="whose committed train split is the data: bfcl (default), "
                   "agentdojo, tau2 (its three domains)")
    p.add_argument("--force", action="store_true", default=None, help="retrain even if up to date")
    p.add_argument("--config", help="YAML file of SFTSettings fields")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--help-config", action="store_true", help="list every settings key")
    p.add_argument("overrides", nargs="*", help="key=value settings")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    # lazy: loads yaml: kept out of --help
    from envace.training.config import ConfigError, config_help, load_config
    from envace.training.sft import SFTSettings

    if args.help_config:
        print(config_help(SFTSettings))
        return 0
    overrides = list(args.overrides)
    for flag, key in _FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"{key}={value}")
    try:
        settings = load_config(SFTSettings, args.config, overrides)
    except ConfigError as exc:
        print(f"envace sft: {terminal_safe(str(exc))}", file=sys.stderr)
        return 2
    # lazy: loads numpy, pydantic, rapidfuzz: kept out of --help
    from envace.training.sft import run_sft

    try:
        run_sft(settings, command=["envace", *sys.argv[1:]], t0=t0, quiet=args.quiet)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"envace sft: {terminal_safe(str(exc))}", file=sys.stderr)
        return 2
    return 0
