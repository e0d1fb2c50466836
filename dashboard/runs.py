"""Finding runs under the dashboard's root, and what each holds.

A *run* is a training run directory (``docs/spec/run_dir.md``: ``config.yaml``, ``metrics.jsonl``,
``rollouts/``, ``audit/step_<N>/``, ``eval/<name>/``, ``report.md``), a plain audit directory
made by ``envace-audit replay`` (``steps.jsonl`` and ``summary.json``), which opens as a run with
one audit, or an evaluation directory made by ``envace eval`` (``summary.json`` beside
``trajectories.jsonl``, its plans' audit in ``audit/``). Status is read from the files
(:func:`run_status`): *finished* when ``report.md`` exists (a clean end); otherwise *running*
only while the run shows a sign of life — its ``heartbeat`` (or ``metrics.jsonl``, or the
``RUNNING`` marker itself) changed in the last two minutes and, when ``RUNNING`` names a PID on
this host, that process is alive; otherwise *died*. A ``RUNNING`` marker alone never makes a
run "running": a crashed run leaves it behind. Paths outside the root are refused
(:func:`resolve_inside`).
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from envace.core.layout import AUDIT, RUN

RUN_MARKERS = RUN.markers
AUDIT_MARKERS = AUDIT.markers
# files a live run keeps touching; "HEARTBEAT" and "heartbeat.json" are older trainers' names
HEARTBEATS = (RUN.metrics, RUN.heartbeat, "HEARTBEAT", "heartbeat.json", RUN.running)
RUNNING_WINDOW_S = 120.0
MAX_DEPTH = 3
_STEP = re.compile(r"step_(\d+)$")


class OutsideRoot(ValueError):
    """A path that lies outside the directory the dashboard was started on."""


@dataclass(frozen=True)
class Audit:
    """One audit directory: a label for menus and its path."""

    label: str
    path: Path
    step: int | None = None  # the training step, for ``audit/step_<N>``


@dataclass
class Run:
    """A run (training run or plain audit directory) found under the root."""

    name: str  # path relative to the root ("." for the root itself)
    path: Path
    kind: str  # "training", "audit", "eval" or "empty"
    status: str  # "finished", "running", "died", "audit", "eval", "empty"
    audits: list[Audit] = field(default_factory=list)  # oldest step first
    evals: list[Path] = field(default_factory=list)
    rollouts: dict[int, Path] = field(default_factory=dict)
    modified: float = 0.0

    @property
    def metrics(self) -> Path:
        return self.path / RUN.metrics

    @property
    def latest_audit(self) -> Audit | None:
        return self.audits[-1] if self.audits else None


def is_audit_dir(p: Path) -> bool:
    return any((p / m).is_file() for m in AUDIT_MARKERS) and not is_eval_dir(p)


def is_eval_dir(p: Path) -> bool:
    """``envace eval``'s output: summary.json beside trajectories (plans, commits), no steps."""
    return ((p / RUN.eval_summary).is_file() and not (p / AUDIT.steps).is_file()
            and not (p / RUN.metrics).exists()
            and any((p / f).is_file() for f in (RUN.eval_trajectories, RUN.plans)))


def is_run_dir(p: Path) -> bool:
    return any((p / m).exists() for m in RUN_MARKERS)


def resolve_inside(root: Path, candidate: str | os.PathLike[str]) -> Path:
    """``candidate`` (absolute, or relative to root) resolved; raises OutsideRoot if it escapes."""
    root = Path(root).resolve()
    p = Path(candidate)
    p = (p if p.is_absolute() else root / p).resolve()
    if p != root and root not in p.parents:
        raise OutsideRoot(f"{candidate} is outside the dashboard root {root}; "
                          "start the dashboard on a directory that contains it.")
    return p


def is_inside(root: Path, p: Path) -> bool:
    try:
        resolve_inside(root, p)
    except OutsideRoot:
        return False
    return True


def _step_of(name: str) -> int | None:
    m = _STEP.search(name)
    return int(m.group(1)) if m else None


def _subdirs(p: Path) -> list[Path]:
    try:
        return sorted(d for d in p.iterdir() if d.is_dir() and not d.name.startswith("."))
    except OSError:
        return []


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    except (OSError, OverflowError, ValueError):
        return False
    return True


def _runner(p: Path) -> tuple[int, str] | None:
    """(pid, host) from the ``RUNNING`` marker the trainer writes (JSON); None for an older
    marker (a time stamp) or an unreadable one."""
    try:
        data = json.loads((p / RUN.running).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    pid, host = data.get("pid"), data.get("host")
    if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and isinstance(host, str):
        return pid, host
    return None


def run_status(p: Path, now: float | None = None) -> str:
    """finished / running / died, read from the files (see the module docstring): the
    heartbeat and the PID are checked before the ``RUNNING`` marker is believed."""
    if (p / RUN.report).is_file():
        return "finished"
    runner = _runner(p) if (p / RUN.running).exists() else None
    if runner is not None and runner[1] == socket.gethostname() and not _pid_alive(runner[0]):
        return "died"  # its process is gone without a clean end
    now = time.time() if now is None else now
    if any(now - _mtime(p / h) < RUNNING_WINDOW_S for h in HEARTBEATS if (p / h).exists()):
        return "running"
    return "died"


def describe(root: Path, p: Path) -> Run:
    """What a directory holds, as a :class:`Run`."""
    name = "." if p == root else str(p.relative_to(root))
    if is_eval_dir(p):
        audits = [Audit("audit", p / RUN.audit)] if is_audit_dir(p / RUN.audit) else []
        return Run(name, p, "eval", "eval", audits, [p], modified=_mtime(p))
    if is_audit_dir(p) and not (p / RUN.audit).is_dir():
        return Run(name, p, "audit", "audit", [Audit("audit", p)], modified=_mtime(p))
    if not is_run_dir(p):
        return Run(name, p, "empty", "empty", modified=_mtime(p))
    audits = [Audit("audit", p / RUN.audit)] if is_audit_dir(p / RUN.audit) else []
    for d in _subdirs(p / RUN.audit):
        if is_audit_dir(d):
            audits.append(Audit(d.name, d, _step_of(d.name)))
    audits.sort(key=lambda a: (a.step is None, a.step if a.step is not None else 0, a.label))
    rollouts = {}
    if (p / RUN.rollouts).is_dir():
        for f in sorted((p / RUN.rollouts).glob("step_*.jsonl")):
            if (s := _step_of(f.stem)) is not None:
                rollouts[s] = f
    evals = [d for d in _subdirs(p / RUN.eval)]
    mod = max([_mtime(p)] + [_mtime(p / h) for h in HEARTBEATS])
    return Run(name, p, "training", run_status(p), audits, evals, rollouts, mod)


def discover(root: Path, max_depth: int = MAX_DEPTH) -> list[Run]:
    """Every run under ``root`` (the root itself included when it is one), by name.

    Empty directories directly under the root are listed (kind "empty") so the user sees them.
    """
    root = Path(root).resolve()
    if not root.is_dir():
        return []
    if is_run_dir(root) or is_audit_dir(root) or is_eval_dir(root):
        return [describe(root, root)]
    found: list[Run] = []

    def walk(d: Path, depth: int) -> None:
        for sub in _subdirs(d):
            if not is_inside(root, sub):  # a symlink leading out of the root
                continue
            if is_run_dir(sub) or is_audit_dir(sub) or depth == 1 and not any(sub.iterdir()):
                found.append(describe(root, sub))
            elif depth < max_depth:
                walk(sub, depth + 1)

    walk(root, 1)
    return sorted(found, key=lambda r: r.name)


def audit_source_file(root: Path, run: Run, audit: Audit, file: str | None) -> Path | None:
    """Where the trajectory file an audit read lies, trying the places it may be relative to.

    ``trajectories.jsonl`` stores the input path as given on the audit's command line.
    Returns None when nothing is found; raises OutsideRoot when the only match is outside.
    """
    cands: list[Path] = []
    if file:
        f = Path(file)
        if f.is_absolute():
            cands.append(f)
        else:
            for base in (run.path, audit.path.parent, audit.path, root, Path.cwd()):
                cands.append(base / f)
    if audit.step is not None and audit.step in run.rollouts:
        cands.append(run.rollouts[audit.step])
    outside = None
    for c in cands:
        if c.is_file():
            if is_inside(root, c):
                return c.resolve()
            outside = c
    if outside is not None:
        raise OutsideRoot(f"the trajectory file {outside} is outside the dashboard root {root}")
    return None
