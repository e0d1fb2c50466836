"""The trainer with its rollouts and final evaluation on vLLM engines the caller may inspect.

    python -m envace.training.vllm_train train --config configs/qwen3_1.7b.yaml model=/path
    python -m envace.training.vllm_train train --resume runs/<name> [--restart]

The same as ``envace train backend=vllm`` (the same arguments, checks and exit codes: 2 bad
usage or config, 130 interrupted with the resume command), printing the weight syncs at the end;
the GPU check (``scripts/gpu_vllm_check.sh``) and tests/vllm/ use it. Needs the vLLM environment
(``bash scripts/setup_vllm.sh``; run with ``.venv-vllm/bin/python``). Kept out of
``envace.model.backends.vllm_backend`` so the model layer never imports the trainer.
"""

from __future__ import annotations

import sys
from pathlib import Path

# imported first: it sets OMP_WAIT_POLICY before torch is imported (see its docstring)
from envace.model.backends.vllm_backend import VLLMRollouts  # isort: skip
from envace.core.interrupts import run_command  # imports no torch
from envace.training.command import add_parser, run
from envace.training.config import TrainConfig


def train_with_vllm(cfg: TrainConfig, resume: bool = False, progress: bool = True,
                    rollouts: VLLMRollouts | None = None, restart: bool = False) -> Path:
    """``envace.training.train.train`` with its rollouts and final evaluation on vLLM (the same as
    ``envace train backend=vllm``, but with engines the caller may inspect). The policy lives on
    cuda when there is one. Engines of a ``rollouts`` passed in are left running."""
    # lazy: loads transformers: only this path needs it
    import envace.training.train as trainer

    own = rollouts is None
    rollouts = VLLMRollouts.for_config(cfg) if rollouts is None else rollouts
    try:
        return trainer.train(cfg, resume=resume, progress=progress, rollout=rollouts,
                             restart=restart)
    finally:
        if own:
            rollouts.close()


def main(argv: list[str] | None = None) -> int:
    """``train [--config PATH | --resume DIR [--restart]] [key=value ...]``: `envace train`'s
    command line, with vLLM rollouts; its exit code."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m envace.training.vllm_train",
                                     description=__doc__.split("\n\n")[0])
    add_parser(parser.add_subparsers(dest="command", required=True), "train")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    syncs: list[str] = []

    def with_vllm(cfg: TrainConfig, resume: bool, progress: bool, restart: bool) -> Path:
        rollouts = VLLMRollouts.for_config(cfg)
        try:
            run_dir = train_with_vllm(cfg, resume, progress, rollouts, restart)
            n = sum(be.syncs for be in rollouts.backends.values())
            syncs.append(f"[vllm] run dir {run_dir}; {n} weight syncs, "
                         f"{rollouts.seconds_sync:.2f} s in all")
            return run_dir
        finally:
            rollouts.close()

    # SIGTERM (a cluster's preemption) and SIGHUP stop it as Ctrl-C does (a stop in training:
    # its resume line)
    code = run_command("envace train", lambda: run(args, train_fn=with_vllm),
                       final=argv is None, atomic=False)
    for line in syncs:
        print(line, flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
