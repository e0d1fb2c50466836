"""Run-directory rules of `envace train`: a new run never reuses a directory, and a resumed one
continues exactly or is refused.

    check_new_run_dir(run_dir)                 # before anything is loaded or written
    plan = plan_resume(run_dir, restart=False) # which checkpoint to continue from, or ResumeError
    keep_metrics(run_dir / RUN.metrics, plan.step)  # drop rows after it, keep bad lines aside

Exact resumption needs every step's ``metrics.jsonl`` row up to the checkpoint resumed from. A
row that does not parse (a line torn by a kill, a hand edit) is moved to
``metrics.jsonl.truncated`` (appended, never lost) and its step counts as missing. The newest
checkpoint is used when every earlier row is there and its own row is there or held by the
checkpoint (``trainer_state.json``'s ``metrics``, written back on resume); otherwise the newest
older checkpoint that has all its rows, and the steps after it are redone. When no kept
checkpoint qualifies, or the run has none, resuming is refused: ``--restart`` starts a run that
has no checkpoint over from step 0 in its own directory (its old ``metrics.jsonl`` is kept as
``metrics.jsonl.before_restart``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.core.layout import RUN
from envace.training.checkpoint import list_checkpoints
from envace.training.config import ConfigError

HEARTBEAT_S = 20.0  # how often a live run touches <run>/heartbeat (the dashboard allows 120 s)


class RunDirError(ConfigError):
    """The run directory cannot be used as asked; the message says what to do instead."""


def check_new_run_dir(run_dir: Path) -> None:
    """Refuse a fresh run in a directory that already holds something."""
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise RunDirError(
            f"{run_dir} already exists and is not empty: continue that run with "
            f"`envace train --resume {run_dir}`, or start a new one with another run_name=... "
            "(a new run never writes into an existing run directory)")


def _rows(path: Path) -> tuple[dict[int, str], list[str]]:
    """Step -> its line (the last one wins), and the lines that are not a row with a step."""
    rows: dict[int, str] = {}
    bad: list[str] = []
    if not path.exists():
        return rows, bad
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            bad.append(line)
            continue
        if isinstance(step, bool) or not isinstance(step, int):
            bad.append(line)
            continue
        rows[step] = line
    return rows, bad


def _checkpoint_info(run_dir: Path, step: int) -> dict[str, Any]:
    try:
        info = json.loads((RUN.checkpoint_dir(run_dir, step) / RUN.trainer_state).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


@dataclass(frozen=True)
class ResumePlan:
    """Where a resumed run continues: the checkpoint ``step`` (None: from step 0, --restart)."""

    step: int | None
    redo: list[int]  # steps whose rows exist but come after the checkpoint (done again)
    torn: int  # unreadable metrics lines, kept aside in metrics.jsonl.truncated


def plan_resume(run_dir: Path, restart: bool = False) -> ResumePlan:
    """The checkpoint an exact resumption continues from; RunDirError when there is none."""
    metrics = run_dir / RUN.metrics
    rows, bad = _rows(metrics)
    ckpts = list_checkpoints(run_dir)
    if restart:
        if ckpts:
            raise RunDirError(
                f"{run_dir} has checkpoint step_{ckpts[-1]}: --restart only starts over a run "
                f"that has none. Resume it without --restart, or start a new run_name=...")
        return ResumePlan(None, sorted(rows), len(bad))
    if not ckpts:
        raise RunDirError(
            f"{run_dir} has no checkpoint to resume from ({len(rows)} step(s) logged): resuming "
            f"would start over from step 0. Say so with `envace train --resume {run_dir} "
            "--restart`, or start a new run with another run_name=...")
    for c in reversed(ckpts):
        missing = [s for s in range(c + 1) if s not in rows]
        if missing == [c] and isinstance(_checkpoint_info(run_dir, c).get("metrics"), dict):
            missing = []  # the checkpoint holds its own row
        if not missing:
            return ResumePlan(c, sorted(s for s in rows if s > c), len(bad))
    shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
    raise RunDirError(
        f"cannot resume {run_dir} exactly: metrics.jsonl lacks the row of step(s) {shown} "
        f"before its checkpoints ({', '.join(f'step_{c}' for c in ckpts)}), and no checkpoint "
        "precedes them"
        + (f" ({len(bad)} unreadable line(s) in metrics.jsonl)" if bad else "")
        + ". Start a new run with another run_name=...")


def keep_metrics(path: Path, upto: int | None) -> None:
    """Keep the rows of steps <= ``upto`` (None: none, a restart); unreadable lines are
    appended to ``metrics.jsonl.truncated``; a restart keeps the old file beside it."""
    if not path.exists():
        return
    rows, bad = _rows(path)
    if bad:
        with open(path.with_name(RUN.metrics_torn), "a", encoding="utf-8") as fh:
            fh.write("".join(f"{x}\n" for x in bad))
    if upto is None:
        os.replace(path, path.with_name(RUN.metrics_before_restart))
        return
    keep = [rows[s] for s in sorted(rows) if s <= upto]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{x}\n" for x in keep), encoding="utf-8")
    os.replace(tmp, path)


def running_marker() -> str:
    """The ``RUNNING`` file's content: who runs the run (the dashboard checks the PID)."""
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})


class Heartbeat:
    """Touch ``<run>/heartbeat`` every ``HEARTBEAT_S`` seconds from a daemon thread, so the
    dashboard tells a live run (even one inside a long step) from a dead one."""

    def __init__(self, run_dir: Path, every: float = HEARTBEAT_S, active: bool = True) -> None:
        self.path = run_dir / RUN.heartbeat
        self.every = every
        self.active = active  # False on ranks other than 0: nothing is written
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="envace-heartbeat", daemon=True)

    def _beat(self) -> None:
        while True:
            with contextlib.suppress(OSError):  # a full disk must not stop the run
                self.path.write_text(str(time.time()))
            if self._stop.wait(self.every):
                return

    def start(self) -> Heartbeat:
        if self.active:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
