"""`envace train`: parse the config (YAML preset + key=value overrides) and run the trainer.

The train command lives with the trainer, not in ``envace.cli``, because two commands share it:
`envace train` (``envace.cli.main`` registers it) and the vLLM lane's
``python -m envace.training.vllm_train train`` (the same arguments, checks and exit codes).

    envace train                                  # configs/tiny.yaml
    envace train --config configs/smollm2.yaml steps=20 lr=2e-6
    envace train --resume runs/<name>             # the run's own config.yaml, from its checkpoint
    envace train --resume runs/<name> --restart   # a run without a checkpoint: over from step 0
    envace train --help-config                    # every key, its default and its help
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from envace.core.interrupts import say, stop_word, stopping
from envace.core.layout import RUN
from envace.core.text import terminal_safe
from envace.model.models import PRESETS

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="role-wise GRPO training with fidelity logging",
                       description=__doc__)
    p.add_argument("--config", help="YAML preset (default: configs/tiny.yaml)")
    p.add_argument("--resume", help="a run directory to continue from its last checkpoint")
    p.add_argument("--restart", action="store_true",
                   help="with --resume: start a run that has no checkpoint over from step 0 in "
                        "its own directory (its old metrics.jsonl is kept aside)")
    p.add_argument("--help-config", action="store_true", help="list every config key")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("overrides", nargs="*", help="key=value")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, train_fn: Any = None) -> int:
    """Check the arguments and the config, train (``train_fn``: another trainer entry with
    ``envace.training.train.train``'s signature, e.g. the vLLM one); the exit code: 0 done,
    2 bad usage or config, 130 interrupted (resumable)."""
    # lazy: loads yaml: kept out of --help
    from envace.training.config import ConfigError, TrainConfig, config_help, load_config

    if args.help_config:
        print(config_help(TrainConfig))
        return 0
    config = args.config
    overrides = list(args.overrides)
    if args.restart and not args.resume:
        print("envace train: --restart goes with --resume runs/<name> (a new run needs no "
              "restart)", file=sys.stderr)
        return 2
    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / RUN.config).exists():
            print(f"envace train: {run_dir} is not a run directory (no {RUN.config})",
                  file=sys.stderr)
            return 2
        config = config or str(run_dir / RUN.config)
        overrides += [f"output_dir={run_dir.parent}", f"run_name={run_dir.name}"]
    elif config is None:
        config = str(DEFAULT_CONFIG)
    if not Path(config).exists():
        print(f"envace train: no such config file {config}; presets: "
              f"{', '.join(p.stem for p in DEFAULT_CONFIG.parent.glob('*.yaml'))}", file=sys.stderr)
        return 2
    try:  # a run's own config.yaml may still hold keys removed since it was written
        cfg = load_config(TrainConfig, config, overrides,
                          drop_removed=bool(args.resume) and args.config is None)
    except ConfigError as exc:
        print(f"envace train: {terminal_safe(str(exc))}", file=sys.stderr)
        return 2
    # a new run: before its directory exists (tester C13: an orphan run); a resumed one starts
    # from its checkpoints, wherever it is resumed from
    problem = None if args.resume else _model_problem(str(cfg.model))
    if problem is not None:
        print(f"envace train: {problem}", file=sys.stderr)
        return 2
    if train_fn is None:
        # lazy: loads torch, transformers: kept out of --help
        from envace.training.train import train as train_fn

    try:
        train_fn(cfg, resume=bool(args.resume), progress=not args.quiet, restart=args.restart)
    except ConfigError as exc:
        print(f"envace train: {terminal_safe(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        signum = stopping()
        say(f"envace train: {stop_word(signum)}; continue with `envace train --resume "
            f"{cfg.run_dir}`")
        return 128 + (signum or signal.SIGINT)
    except (OSError, RuntimeError) as exc:  # a full disk, a read-only output_dir
        line = _write_failure(cfg.run_dir, exc)
        if line is None:
            raise
        print(f"envace train: {line}", file=sys.stderr)
        return 2
    return 0


def _model_problem(spec: str) -> str | None:
    """Why ``model`` names no model this command can start from (a preset or a model folder;
    a relative path is read from the current directory), or None."""
    if spec in PRESETS:
        return None
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return None
    where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
    return (f"model={spec!r} is neither a preset ({', '.join(PRESETS)}) nor a model folder"
            f"{where}")


def _write_failure(run_dir: Path, exc: BaseException) -> str | None:
    """One line for a failure to write the run (the system's reason), None for anything else
    (a RuntimeError that is no I/O failure is a bug and keeps its traceback)."""
    # lazy: loads torch: kept out of --help
    from envace.training.checkpoint import CheckpointWriteError, write_failure

    if isinstance(exc, CheckpointWriteError):
        line = str(exc)
    elif isinstance(exc, OSError):
        line = write_failure(Path(exc.filename).parent if exc.filename else run_dir, exc,
                             Path(exc.filename).name if exc.filename else "the run")
    else:
        line = write_failure(run_dir, exc, "the run")
        if line.endswith(f"{type(exc).__name__}: {str(exc)[:200]}"):
            return None  # neither a full disk nor an unwritable directory: not an I/O failure
    resumable = (run_dir / RUN.config).exists()
    return line + (f"; continue with `envace train --resume {run_dir}` once it can be written"
                   if resumable else "")
