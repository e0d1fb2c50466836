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
older checkpoint that has all its rows, and the steps after it are redone. A checkpoint whose
files are damaged (``checkpoint_problem``: a truncated ``model.safetensors``, ``trainer_state``
file) is passed over for the newest intact one before it, and the trainer says so on stderr:
that older checkpoint and the metrics rows up to it resume the run exactly (the later steps are
redone as they were first done), whereas the damaged one cannot be loaded at all, so refusing
would only make the user delete it by hand. When no kept checkpoint qualifies, or the run has
none, resuming is refused: ``--restart`` starts a run that
has no checkpoint over from step 0 in its own directory (its old ``metrics.jsonl`` is kept as
``metrics.jsonl.before_restart``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import struct
import threading
import time
import zipfile
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


class RunLock:
    """An exclusive ``flock`` on ``<run>/.train.lock`` for as long as one process trains the
    run: a second ``envace train`` of the same run (two ``--resume`` at once) is refused
    before it reads or writes anything. The kernel drops it when the process dies; the file is
    deleted on release (a refused command leaves the run as it was), so a lock taken on a file
    deleted meanwhile is taken again."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / RUN.lock
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                who = ""
                with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                    pid = json.loads((self.path.parent / RUN.running).read_text())["pid"]
                    who = f" (pid {pid})"
                raise RunDirError(f"{self.path.parent} is being trained by another envace "
                                  f"train{who}: wait for it to end (or stop it) before "
                                  "resuming") from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return self
            os.close(fd)  # its holder released and deleted it between our open and flock
        raise RunDirError(f"cannot take the lock {self.path}")

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)  # still held: no one else has it now
            os.close(self._fd)
            self._fd = None


def checkpoint_problem(run_dir: Path, step: int) -> str | None:
    """Why checkpoint ``step`` cannot be loaded (a truncated or unreadable file), or None.
    Cheap: JSON parsed, each safetensors header checked against its file's size, the torch
    archive's central directory read (what a truncation loses first). Files that are absent
    are left to the loader (its error names them)."""
    folder = RUN.checkpoint_dir(run_dir, step)
    try:
        info = json.loads((folder / RUN.trainer_state).read_text())
        if not isinstance(info, dict) or info.get("step") != step:
            return f"{RUN.trainer_state} does not name step {step}"
    except (OSError, ValueError) as exc:
        return f"{RUN.trainer_state} unreadable ({type(exc).__name__}: {str(exc)[:80]})"
    if (folder / RUN.trainer_tensors).exists():
        try:
            with zipfile.ZipFile(folder / RUN.trainer_tensors) as z:
                z.namelist()
        except (OSError, zipfile.BadZipFile) as exc:
            return f"{RUN.trainer_tensors} unreadable ({str(exc)[:80]})"
    for f in sorted(folder.glob("*/*.safetensors")):
        why = _safetensors_problem(f)
        if why:
            return f"{f.relative_to(folder)} {why}"
    return None


def _safetensors_problem(path: Path) -> str | None:
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > size:
                return f"is truncated ({size} bytes, header says more)"
            header = json.loads(fh.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items()
                   if k != "__metadata__"), default=0)
    except (OSError, ValueError, struct.error, KeyError, TypeError, IndexError) as exc:
        return f"is unreadable ({type(exc).__name__})"
    if 8 + n + end != size:
        return f"is truncated ({size} of {8 + n + end} bytes)"
    return None


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
    damaged: tuple[tuple[int, str], ...] = ()  # newer checkpoints passed over, and why


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
    damaged: list[tuple[int, str]] = []
    for c in reversed(ckpts):
        why = checkpoint_problem(run_dir, c)
        if why is not None:  # a damaged checkpoint is passed over for the one before it
            damaged.append((c, why))
            continue
        missing = [s for s in range(c + 1) if s not in rows]
        if missing == [c] and isinstance(_checkpoint_info(run_dir, c).get("metrics"), dict):
            missing = []  # the checkpoint holds its own row
        if not missing:
            return ResumePlan(c, sorted(s for s in rows if s > c), len(bad), tuple(damaged))
    if len(damaged) == len(ckpts):
        raise RunDirError(
            f"cannot resume {run_dir}: every checkpoint is damaged ("
            + "; ".join(f"step_{c}: {why}" for c, why in damaged)
            + "). Start a new run with another run_name=...")
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
