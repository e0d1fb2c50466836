"""Where an audit is written: a locked, checked, all-or-nothing output directory, and the one
writer of an audit directory's files.

    with AuditWriter(out, inputs=[dev]) as w:    # replay, probe, rescore and the trainer
        w.write_steps(records, trajectory_row)   # steps.jsonl lines checked (audit.store.models)
        summary = w.finish(summary, plots=True)  # summary.json, report.md, plots
    # on a normal exit the directory is renamed to `out`; on an exception it is deleted

    with OutputDir(out, inputs=[train, dev], kind="audit") as tmp:
        ...write every file into tmp...         # the lower level (compare uses it)

Rules (README, "Formats and exit codes"):

- **Nothing is written over an input.** An input (file or directory) equal to, inside, or
  containing the output, or the same file (inode) as anything in it, is refused.
- **Nothing is written over another tool's files.** An existing output directory must be empty
  or clearly an earlier output of the same command (``kind``): every entry one of that kind's
  file names, and for an audit a ``summary.json`` of schema ``envace.audit/*`` (or, when that is
  damaged, a ``steps.jsonl``); anything else is refused.
- **All or nothing.** Files go to a fresh sibling directory ``.NAME.partial-XXXX``; when complete
  an earlier output is renamed aside (``.NAME.old-XXXX``), the new one renamed in, the old one
  deleted. An interrupted command leaves the earlier output or nothing, never a mix; the next
  command into the same place deletes leftovers (and restores an earlier output whose
  replacement never arrived).
- **One writer.** An exclusive ``flock`` on the sibling ``.NAME.lock`` (deleted on release; a
  lock taken on a file deleted meanwhile is retried); a second writer is refused at once.

Every refusal is an :class:`OutputRefused` (the CLI's exit code 2), raised before anything is
written.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from audit.store.models import summary_data
from audit.store.report import write_report
from audit.store.step_rows import step_line
from envace.core.errors import UsageError
from envace.core.interrupts import note_written, signals_held
from envace.core.layout import AUDIT
from envace.core.schema import json_text

#: File names each kind of output may hold (with the landed code's leftovers).
KNOWN_FILES = {
    "audit": {*AUDIT.files, *(f"{n}.partial" for n in (AUDIT.steps, AUDIT.trajectories)),
              *(f"{n}.tmp" for n in (AUDIT.summary, AUDIT.report))},
    "compare": {AUDIT.compare_json, AUDIT.compare_md, f"{AUDIT.compare_json}.tmp"},
}
AUDIT_SCHEMA_PREFIX = "envace.audit/"


class OutputRefused(UsageError):
    """The output directory may not be written (inputs, foreign files, a lock, the OS)."""


def _resolved(p: str | os.PathLike[str]) -> Path:
    return Path(os.path.abspath(os.fspath(p))).resolve()


def _inode(p: Path) -> tuple[int, int] | None:
    try:
        st = p.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def is_earlier_output(out: Path, kind: str) -> tuple[bool, str]:
    """(True, "") when ``out`` is empty or an earlier output of ``kind``; else (False, why)."""
    names = sorted(os.listdir(out))
    if not names:
        return True, ""
    foreign = [n for n in names if n not in KNOWN_FILES[kind] or not (out / n).is_file()]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5
                                          else "")
        return False, f"it holds files that are not an envace-audit {kind}'s: {shown}"
    if kind == "compare":
        return (AUDIT.compare_json in names, f"it holds no {AUDIT.compare_json}")
    try:
        schema = json.loads((out / AUDIT.summary).read_text(encoding="utf-8")).get("schema")
    except (OSError, ValueError, AttributeError, RecursionError):
        schema = None
    if isinstance(schema, str) and schema.startswith(AUDIT_SCHEMA_PREFIX):
        return True, ""
    if AUDIT.steps in names:  # an audit whose summary.json is missing or damaged
        return True, ""
    return False, f"it holds no envace-audit {AUDIT.summary} or {AUDIT.steps}"


def check_inputs(out: Path, inputs: Iterable[str | os.PathLike[str]],
                 replaces: str | os.PathLike[str] | None = None) -> None:
    """Refuse an output that is, holds or lies inside an input (``replaces``: the one input
    that is allowed to be the output itself, e.g. an audit rescored in place)."""
    allowed = _resolved(replaces) if replaces is not None else None
    own = set()
    if out.is_dir():
        for root, _dirs, files in os.walk(out):
            for f in files:
                ino = _inode(Path(root) / f)
                if ino:
                    own.add(ino)
    for raw in inputs:
        p = _resolved(raw)
        if p == out and p == allowed:
            continue
        if p == out or out in p.parents:
            raise OutputRefused(f"input {raw} is inside the output directory {out}; "
                                "choose another --out")
        if p in out.parents:
            raise OutputRefused(f"the output directory {out} lies inside the input {raw}")
        ino = _inode(p)
        if ino is not None and ino in own:
            raise OutputRefused(f"input {raw} is the same file as one in the output directory "
                                f"{out}; choose another --out")


class OutputDir:
    """Lock ``out``, check it, hand out a fresh temporary directory, rename it into place."""

    def __init__(self, out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]] = (),
                 kind: str = "audit", replaces: str | os.PathLike[str] | None = None) -> None:
        if not os.fspath(out).strip():
            raise OutputRefused("--out is empty")
        self.out = _resolved(out)
        self.inputs = [i for i in inputs if i is not None]
        self.kind = kind
        self.replaces = replaces
        self.tmp: Path | None = None
        self._lock_fd: int | None = None
        self._lock_path: Path | None = None

    # ------------------------------------------------------------------ entering
    def __enter__(self) -> Path:
        out = self.out
        if out == out.parent:
            raise OutputRefused(f"cannot write over the root directory {out}")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputRefused(f"cannot create {out.parent}: {exc.strerror or exc}") from None
        self._check()  # before the lock file is made: a refused output writes nothing at all
        self._lock()
        try:
            self._recover()
            self._check()  # again, under the lock
            try:
                self.tmp = self._sibling_dir("partial")
            except OSError as exc:
                raise OutputRefused(f"cannot write in {out.parent}: {exc.strerror or exc}"
                                    ) from None
        except BaseException:
            self._unlock()
            raise
        return self.tmp

    def _check(self) -> None:
        out = self.out
        if out.exists() and not out.is_dir():
            raise OutputRefused(f"--out {out} exists and is not a directory")
        check_inputs(out, self.inputs, self.replaces)
        if out.is_dir():
            try:
                ok, why = is_earlier_output(out, self.kind)
            except OSError as exc:
                ok, why = False, f"it cannot be read ({exc.strerror or exc})"
            if not ok:
                raise OutputRefused(f"refusing to write into {out}: {why}; choose an empty "
                                    "or new directory")

    def _lock(self) -> None:
        """Take the exclusive lock on ``.NAME.lock`` or refuse at once. The file is deleted on
        release, so a lock taken on a file that was meanwhile deleted (or replaced) is retried."""
        path = self.out.parent / f".{self.out.name}.lock"
        for _ in range(100):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise OutputRefused(f"cannot write in {self.out.parent}: {exc.strerror or exc}"
                                    ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise OutputRefused(f"another envace-audit command is writing to {self.out} "
                                    f"(lock {path} is held); wait for it to finish") from None
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._lock_fd, self._lock_path = fd, path
                return
            os.close(fd)  # the holder released and deleted it between our open and flock
        raise OutputRefused(f"cannot take the lock {path}")

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._lock_path)  # still held: no one else has it now
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def _sibling_dir(self, tag: str) -> Path:
        """A new empty directory ``.NAME.TAG-XXXXXXXX`` beside the output (umask honoured)."""
        for _ in range(100):
            p = self.out.parent / f".{self.out.name}.{tag}-{secrets.token_hex(4)}"
            try:
                p.mkdir(mode=0o777)
                return p
            except FileExistsError:
                continue
        raise FileExistsError(f"no free name for .{self.out.name}.{tag}-* in {self.out.parent}")

    def _siblings(self, tag: str) -> list[Path]:
        prefix = f".{self.out.name}.{tag}-"
        return sorted((p for p in self.out.parent.iterdir() if p.name.startswith(prefix)),
                      key=lambda p: p.stat().st_mtime)

    def _recover(self) -> None:
        """Under the lock: leftovers of an interrupted command into the same place."""
        try:
            olds = self._siblings("old")
            if olds and not self.out.exists():  # killed between the two renames
                os.rename(olds.pop(), self.out)
            for p in olds + self._siblings("partial"):
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass

    # ------------------------------------------------------------------ leaving
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc_type is None:
                self._commit()
            elif self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
        finally:
            self._unlock()

    def _commit(self) -> None:
        """The earlier output renamed aside, the new one into place, as one step: a stop signal
        that comes between the two renames takes effect after them (``signals_held``), so a
        stopped command leaves the earlier output or the new one, never neither."""
        assert self.tmp is not None
        out, old = self.out, None
        try:
            with signals_held():
                try:
                    if out.exists():
                        old = self._sibling_dir("old")
                        os.rename(out, old)  # onto the empty directory just made: a unique name
                    os.rename(self.tmp, out)
                except OSError as exc:
                    if old is not None and not out.exists():
                        os.rename(old, out)
                    shutil.rmtree(self.tmp, ignore_errors=True)
                    raise OutputRefused(f"cannot move the new output into {out}: "
                                        f"{exc.strerror or exc}") from None
                note_written(out)
        finally:  # the earlier output goes once another is in place (restored, or the new one)
            if old is not None and out.exists():
                shutil.rmtree(old, ignore_errors=True)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary file and a rename."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json_text(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class AuditWriter:
    """The one writer of an audit directory (``envace-audit replay``, ``probe``, ``rescore`` and
    the trainer's ``audit/step_<N>/``): an :class:`OutputDir` of kind ``audit`` holding
    ``steps.jsonl`` (every line a :class:`audit.store.step_rows.StepRow`), ``trajectories.jsonl``,
    ``summary.json`` (an :class:`audit.store.models.AuditSummary`), ``report.md`` and its plots.

    ``trajectories=False`` (rescore) writes no ``trajectories.jsonl`` unless one is copied in
    (:meth:`copy_trajectories`). Leaving the ``with`` block without :meth:`finish` (an
    exception) writes nothing.
    """

    def __init__(self, out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]] = (),
                 replaces: str | os.PathLike[str] | None = None,
                 trajectories: bool = True) -> None:
        self._out = OutputDir(out, inputs, kind="audit", replaces=replaces)
        self._with_trajectories = trajectories
        self.dir: Path | None = None
        self._steps: Any = None
        self._trajs: Any = None
        self.finished = False

    def __enter__(self) -> AuditWriter:
        self.dir = self._out.__enter__()
        try:
            self._steps = open(self.dir / AUDIT.steps, "w", encoding="utf-8")  # noqa: SIM115
            if self._with_trajectories:
                self._trajs = open(self.dir / AUDIT.trajectories, "w",  # noqa: SIM115
                                   encoding="utf-8")
        except BaseException as exc:
            self._close()
            self._out.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def write_lines(self, steps_text: str, trajectory_text: str = "") -> None:
        """Lines already made by :func:`audit.store.step_rows.step_line` (in a worker process) and
        ``json.dumps`` of a trajectory row."""
        self._steps.write(steps_text)
        if trajectory_text:
            self._trajs.write(trajectory_text)

    def write_steps(self, records: Iterable[dict[str, Any]],
                    trajectory: dict[str, Any] | None = None) -> None:
        """One trajectory's step records (checked: ``pydantic.ValidationError`` for a record
        that is not a step row) and its ``trajectories.jsonl`` row."""
        text = "".join(step_line(r) for r in records)
        row = "" if trajectory is None else json_text(trajectory) + "\n"
        self.write_lines(text, row)

    def copy_trajectories(self, src: Path) -> None:
        """An earlier audit's ``trajectories.jsonl``, byte for byte (rescore)."""
        assert self.dir is not None
        if self._trajs is not None:
            self._trajs.close()
            self._trajs = None
        shutil.copyfile(src, self.dir / AUDIT.trajectories)

    def path(self, name: str) -> Path:
        """Where a further file of the audit goes (``AUDIT.unreadable``)."""
        assert self.dir is not None and name in AUDIT.files
        return self.dir / name

    def finish(self, summary: dict[str, Any], plots: bool = True) -> dict[str, Any]:
        """Close the line files, write ``summary.json`` (checked against
        :class:`audit.store.models.AuditSummary`) and ``report.md`` with its plots; return the
        summary as written."""

        assert self.dir is not None
        self._close()
        data = summary_data(summary)
        write_json_atomic(self.dir / AUDIT.summary, data)
        write_report(self.dir, data, plots=plots)
        self.finished = True
        return data

    def _close(self) -> None:
        """Close both files (each tried, even when the other's last flush fails: a full
        disk); the first failure is raised after."""
        failure: BaseException | None = None
        for fh in (self._steps, self._trajs):
            if fh is not None:
                try:
                    fh.close()
                except OSError as exc:
                    failure = failure or exc
        self._steps = self._trajs = None
        if failure is not None:
            raise failure

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._close()
        except OSError as failure:  # the last flush found the disk full: nothing is kept
            self._out.__exit__(type(failure), failure, failure.__traceback__)
            if exc_type is None:
                raise
            return
        if exc_type is None and not self.finished:
            exc = RuntimeError("AuditWriter left without finish(): nothing written")
            self._out.__exit__(RuntimeError, exc, None)
            raise exc
        self._out.__exit__(exc_type, exc, tb)
