"""Metrics sinks besides ``metrics.jsonl`` (``report_to``), as transformers' Trainer has them.

    reporter = make_reporter("tensorboard", run_dir, config_dict)   # or "wandb", "none"
    reporter.log(record, step)
    reporter.close()

- ``tensorboard``: event files in ``<run>/tensorboard/`` (``torch.utils.tensorboard``; needs the
  ``tensorboard`` package: ``pip install 'envace[report]'``). Open with
  ``tensorboard --logdir runs/``.
- ``wandb``: a Weights & Biases run named after the run directory, files in ``<run>/wandb/``.
  With no network (``WANDB_MODE=offline``) it is written offline; ``wandb sync`` uploads it later.

Only numbers are reported (strings, lists and None are left to ``metrics.jsonl``). The JSONL file
stays the record of truth: a sink that fails is reported once and the run goes on.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

SINKS = ("none", "tensorboard", "wandb")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics record (booleans excluded), without the step."""
    return {k: float(v) for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"
            and math.isfinite(float(v))}


class Reporter:
    """No sink: every call does nothing (``report_to: none``)."""

    def log(self, record: dict[str, Any], step: int) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardReporter(Reporter):
    def __init__(self, run_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch's writer imports the tensorboard package
            raise RuntimeError("report_to=tensorboard needs the tensorboard package: "
                               "pip install 'envace[report]' (or report_to=none)") from exc
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, record: dict[str, Any], step: int) -> None:
        for k, v in scalars(record).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbReporter(Reporter):
    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise RuntimeError("report_to=wandb needs the wandb package: "
                               "pip install 'envace[report]' (or report_to=none)") from exc
        self.run = wandb.init(project="envace", name=run_dir.name, dir=str(run_dir),
                              config=config, resume="allow", id=_wandb_id(run_dir))

    def log(self, record: dict[str, Any], step: int) -> None:
        self.run.log(scalars(record), step=step)

    def close(self) -> None:
        self.run.finish()


def _wandb_id(run_dir: Path) -> str:
    """One W&B run per run directory, so that a resumed run continues the same one."""
    import hashlib

    return "envace-" + hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:12]


class _Guarded(Reporter):
    """A sink that fails after start-up is reported once; the run (and metrics.jsonl) go on."""

    def __init__(self, inner: Reporter) -> None:
        self.inner, self.failed = inner, False

    def log(self, record: dict[str, Any], step: int) -> None:
        if self.failed:
            return
        try:
            self.inner.log(record, step)
        except Exception as exc:  # noqa: BLE001 - a metrics sink must not kill training
            self.failed = True
            print(f"[train] report_to sink failed, metrics.jsonl goes on: {exc}",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if not self.failed:
            self.inner.close()


def make_reporter(kind: str, run_dir: Path, config: dict[str, Any]) -> Reporter:
    """The sink for ``report_to`` (errors at start-up name the missing package)."""
    if kind == "none":
        return Reporter()
    if kind == "tensorboard":
        return _Guarded(TensorBoardReporter(run_dir))
    if kind == "wandb":
        return _Guarded(WandbReporter(run_dir, config))
    raise ValueError(f"report_to must be one of {SINKS}, got {kind!r}")


__all__ = ["SINKS", "Reporter", "make_reporter", "scalars"]
