"""The trainer with its rollouts and final evaluation on vLLM engines the caller may inspect.

    python -m envace.training.vllm_train train --config configs/qwen3_1.7b.yaml model=/path

The same as ``envace train backend=vllm``, printing the weight syncs at the end; the GPU check
(``scripts/gpu_vllm_check.sh``) and tests/vllm/ use it. Needs the vLLM environment (``bash
scripts/setup_vllm.sh``; run with ``.venv-vllm/bin/python``). Kept out of
``envace.model.backends.vllm_backend`` so the model layer never imports the trainer.
"""

from __future__ import annotations

import sys
from pathlib import Path

# imported first: it sets OMP_WAIT_POLICY before torch is imported (see its docstring)
from envace.model.backends.vllm_backend import VLLMRollouts
from envace.training.config import TrainConfig, parse_cli


def train_with_vllm(cfg: TrainConfig, resume: bool = False, progress: bool = True,
                    rollouts: VLLMRollouts | None = None) -> Path:
    """``envace.training.train.train`` with its rollouts and final evaluation on vLLM (the same as
    ``envace train backend=vllm``, but with engines the caller may inspect). The policy lives on
    cuda when there is one. Engines of a ``rollouts`` passed in are left running."""
    import envace.training.train as trainer

    own = rollouts is None
    rollouts = VLLMRollouts.for_config(cfg) if rollouts is None else rollouts
    try:
        return trainer.train(cfg, resume=resume, progress=progress, rollout=rollouts)
    finally:
        if own:
            rollouts.close()


def main(argv: list[str] | None = None) -> int:
    """``train [--config PATH] [key=value ...]``: the trainer with vLLM rollouts."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "train":
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    cfg = parse_cli(TrainConfig, argv[1:])
    rollouts = VLLMRollouts.for_config(cfg)
    try:
        run = train_with_vllm(cfg, rollouts=rollouts)
        syncs = sum(be.syncs for be in rollouts.backends.values())
        print(f"[vllm] run dir {run}; {syncs} weight syncs, {rollouts.seconds_sync:.2f} s in all",
              flush=True)
    finally:
        rollouts.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
