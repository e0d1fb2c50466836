"""Resumable checkpoints: model(s), optimizer(s), scheduler(s), RNG states and data position.

    save_checkpoint(run_dir, step, models, tokenizer, optimizer_states, schedulers, extra)
    state = load_latest(run_dir)      # None when the run has none
    state = load_checkpoint(run_dir, 3)  # a given one (envace.training.resume.plan_resume picks it)

A checkpoint is written into a temporary folder and renamed into place, so a run killed while
saving leaves the previous checkpoint intact. The newest ``keep`` checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envace.core.layout import RUN


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir: Path, step: int, models: dict[str, Any], tokenizer: Any,
                    optimizer_states: dict[str, dict[str, Any]], schedulers: dict[str, Any],
                    extra: dict[str, Any], keep: int = 2) -> Path:
    """Write checkpoint ``step`` atomically; ``optimizer_states``: each optimizer's state dict
    (``opt.state_dict()``, or the gathered whole state under FSDP)."""
    final = RUN.checkpoint_dir(run_dir, step)
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        for name, model in models.items():
            model.save_pretrained(tmp / name)
            tokenizer.save_pretrained(tmp / name)
        torch.save({"optimizers": optimizer_states,
                    "schedulers": {k: s.state_dict() for k, s in schedulers.items()},
                    "rng": rng_state()}, tmp / RUN.trainer_tensors)
        (tmp / RUN.trainer_state).write_text(json.dumps({"step": step, **extra}, indent=1))
    except (OSError, RuntimeError) as exc:  # torch says "unexpected pos" for a full disk
        shutil.rmtree(tmp, ignore_errors=True)  # never leave a half checkpoint filling the disk
        raise CheckpointWriteError(write_failure(tmp.parent, exc, f"checkpoint step_{step}")
                                   ) from exc
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    done = sorted(list_checkpoints(run_dir))
    for old in done[:-keep]:
        shutil.rmtree(RUN.checkpoint_dir(run_dir, old), ignore_errors=True)
    return final


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (nothing of it is left behind)."""


def write_failure(where: Path, exc: BaseException, what: str) -> str:
    """One line saying why ``what`` could not be written under ``where``: the system's reason
    (no space left, read-only, permission), found out when the library's error hides it."""
    import errno

    code = getattr(exc, "errno", None)
    if code is None:
        probe = Path(where)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        try:
            free = shutil.disk_usage(probe).free
        except OSError:
            free = None
        if free is not None and free < 64 * 1024 * 1024:
            code = errno.ENOSPC
        elif not os.access(probe, os.W_OK):
            code = errno.EACCES
    reason = os.strerror(code) if code else f"{type(exc).__name__}: {str(exc)[:200]}"
    return f"cannot write {what} in {where}: {reason}"


def list_checkpoints(run_dir: Path) -> list[int]:
    root = Path(run_dir) / RUN.checkpoints
    if not root.exists():
        return []
    return sorted(int(p.name.split("_", 1)[1]) for p in root.glob("step_*")
                  if p.name.split("_", 1)[1].isdigit() and (p / RUN.trainer_state).exists())


def load_latest(run_dir: Path) -> dict[str, Any] | None:
    """The newest complete checkpoint: its folder, step, extra info and torch state."""
    steps = list_checkpoints(run_dir)
    if not steps:
        return None
    return load_checkpoint(run_dir, steps[-1])


def load_checkpoint(run_dir: Path, step: int) -> dict[str, Any]:
    """Checkpoint ``step`` (an older one when the newest cannot be resumed exactly:
    ``envace.training.resume.plan_resume``): its folder, step, extra info and torch state."""
    folder = RUN.checkpoint_dir(run_dir, step)
    info = json.loads((folder / RUN.trainer_state).read_text())
    state = torch.load(folder / RUN.trainer_tensors, weights_only=False)
    return {"folder": folder, "step": info["step"], "info": info, **state}
