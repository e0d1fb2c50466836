"""Stream trajectory files through replay and write an audit directory.

    from audit.pipeline import run_audit
    summary = run_audit(["rollouts.jsonl"], "audit_out", AuditOptions(workers=2))

Writes (docs/spec/trajectory.md, "Audit output"): ``steps.jsonl`` (one line per tool call),
``trajectories.jsonl`` (one line per trajectory), ``summary.json`` and ``report.md`` with PNG
plots, all into a fresh directory renamed into place when complete (``audit.store.output``: locked,
never over an input or another tool's files). Input is streamed: at most a bounded window of
trajectories is in flight, and only a compact row per step (no texts) is kept for the
statistics.

One bad record costs one record: a line that cannot be read, validated, replayed, scored or
serialised is listed in ``skipped_records`` with its file, line and a one-line reason, and the
rest is audited (read = audited + skipped). A trajectory id seen before is skipped (the first
record with an id is the one audited). Non-finite numbers (NaN, Infinity, 1e400) are replayed
as the floats they are and named in ``warnings`` with their file, line and field.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from audit.replay import ReplayError, replay_trajectory, send_ahead
from audit.scoring.settings import AuditOptions, Override
from audit.shard import UNREADABLE_OWNER, shard_block, shard_of
from audit.shard import check_inputs as check_shard_inputs
from audit.stats.aggregate import SummaryAggregator
from audit.stats.summary import compact
from audit.store.models import place, skipped_row
from audit.store.output import AuditWriter
from audit.store.step_rows import step_line
from audit.worlds.reference import REFERENCE_NAMES, build_reference
from envace.core.envs.guard_ahead import MAX_AHEAD
from envace.core.errors import UsageError
from envace.core.schema import MAX_LINE_BYTES, Trajectory, json_text, read_trajectories

__all__ = ["read_reference", "reference_triples", "run_audit", "nonfinite_paths"]


Triple = tuple[str, dict, str]
_WORKER: dict[str, Any] = {}


def read_reference(path: str | os.PathLike[str]) -> tuple[list[Triple], dict[str, Any]]:
    """(tool, arguments, real response) of every answered, well-formed call in a file, and a
    report of the file: records read, usable trajectories, calls, skipped lines (file, line,
    reason). Raises :class:`UsageError` when nothing in it is usable."""
    out: list[Triple] = []
    skipped: list[dict[str, Any]] = []
    read = usable = 0
    try:
        for item in read_trajectories(path):
            read += 1
            if item.trajectory is None:
                skipped.append(skipped_row(item.path, item.line, item.error))
                continue
            usable += 1
            for st in item.trajectory.tool_steps():
                if (st.arguments is not None and st.response is not None
                        and not st.response.rehearsed):
                    out.append((st.tool, st.arguments, st.response.content or ""))
    except OSError as exc:
        raise UsageError(f"cannot read --reference {path}: {exc.strerror or exc}") from None
    report = {"file": str(path), "records_read": read, "trajectories": usable,
              "calls": len(out), "skipped_records": skipped}
    if not out:
        first = f"; {place(skipped[0])}: {skipped[0]['reason']}" if skipped else ""
        raise UsageError(f"--reference {path} holds no usable record ({read} read, "
                         f"{len(skipped)} unreadable{first}; no answered real call)")
    return out, report


def reference_triples(path: str | os.PathLike[str]) -> list[Triple]:
    """(tool, arguments, real response) of every answered, well-formed call in a file."""
    return read_reference(path)[0]


#: where a trajectory's calls keep their arguments: JSON text there is parsed and walked too
_CALL_ARGUMENTS = re.compile(r"messages\[\d+\]\.tool_calls\[\d+\]\.function\.arguments")


def nonfinite_paths(obj: Any, limit: int = 5) -> list[str]:
    """Where ``obj`` (a trajectory, plain data) holds NaN or an infinity, e.g.
    ``messages[1].tool_calls[0].function.arguments.x = nan``: any value, and the values of a
    call's arguments given as JSON text (JSON text elsewhere, even within those arguments, is a
    string: it reaches the environment as one). At most ``limit``; no recursion, so any depth
    is safe. The audit walks only a record its reader flagged
    (``envace.core.schema.may_hold_nonfinite``)."""
    from pydantic import BaseModel

    found: list[str] = []
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack and len(found) < limit:
        where, v = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                found.append(f"{where or '(value)'} = {v}")
        elif isinstance(v, BaseModel):
            items = {**v.__dict__, **(v.__pydantic_extra__ or {})}
            stack.extend((f"{where}.{'schema' if k == 'schema_' else k}".lstrip("."), x)
                         for k, x in reversed(items.items()))
        elif isinstance(v, dict):
            stack.extend((f"{where}.{k}".lstrip("."), x) for k, x in reversed(v.items()))
        elif isinstance(v, list | tuple):
            stack.extend((f"{where}[{i}]", x) for i, x in reversed(list(enumerate(v))))
        elif isinstance(v, str) and v[:1] == "{" and _CALL_ARGUMENTS.fullmatch(where):
            with contextlib.suppress(ValueError, RecursionError):
                stack.append((where, json.loads(v)))
    return found


# ---------------------------------------------------------------- the work on one record


@dataclass
class _Done:
    """One audited trajectory, serialised: the lines to write and the rows to keep."""

    steps_text: str
    traj_text: str
    rows: list[dict[str, Any]]
    warnings: list[str]
    trajectory_id: str
    n_steps: int


def _setup_worker(opts: AuditOptions, triples: list[Triple] | None) -> None:
    refs: dict[str, Override] = {}
    if triples is not None:
        refs = {n: build_reference(n, triples) for n in REFERENCE_NAMES}
    override = refs.get(opts.override) if opts.override else None
    _WORKER.update(
        settings=replace(opts, references={} if override else refs),
        override=override,
        envs={},
    )


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this process when its parent dies (even by SIGKILL)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's shutdown still ends us
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _pool_init(parent: int, opts: AuditOptions, triples: list[Triple] | None) -> None:
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _setup_worker(opts, triples)


#: one record to audit: (file, line, trajectory, whether its line may hold a non-finite number)
Job = tuple[str, int, Trajectory, bool]


def _work(job: Job, ahead: Any = None, then: Callable[[], None] | None = None
          ) -> tuple[str, int, _Done | str]:
    path, line, traj, maybe_nonfinite = job
    try:
        res = replay_trajectory(traj, _WORKER["settings"], _WORKER["envs"], _WORKER["override"],
                                ahead=ahead, then=then)
    except ReplayError as exc:
        return path, line, f"cannot replay: {exc}"
    except RecursionError:
        return path, line, "replay failed: nested too deeply"
    except Exception as exc:  # a bug or a hostile record must not stop the audit
        return path, line, f"replay failed: {type(exc).__name__}: {_one_line(exc)}"
    try:
        warnings = list(res.warnings)
        bad = nonfinite_paths(traj) if maybe_nonfinite else []
        if bad:
            warnings.append("non-finite number(s) replayed as they are (written NaN/Infinity): "
                            + "; ".join(bad))
        steps_text = "".join(step_line(r) for r in res.steps)
        traj_text = json_text({**res.summary, "file": path, "line": line}) + "\n"
        rows = [compact(r) for r in res.steps]
        for text in (*steps_text.splitlines(), traj_text):
            if len(text) > MAX_LINE_BYTES // 4 and len(text.encode("utf-8")) > MAX_LINE_BYTES:
                return path, line, (f"cannot write the audit of this record: a line of "
                                    f"{len(text.encode('utf-8'))} bytes passes the "
                                    f"{MAX_LINE_BYTES}-byte line limit (docs/audit.md)")
    except (ValueError, TypeError, RecursionError) as exc:  # ValidationError is a ValueError
        return path, line, f"cannot serialise the audit of this record: {_one_line(exc)}"
    return path, line, _Done(steps_text, traj_text, rows, warnings, traj.id, len(res.steps))


def _work_in_turn(jobs: Iterator[Job]) -> Iterator[tuple[str, int, _Done | str]]:
    """:func:`_work` over ``jobs`` in one process, the calls of the next trajectories sent to
    the environment's process as soon as this one has its real answers, so that process runs
    them while this one scores (``audit.replay.send_ahead``; up to
    ``envace.core.envs.guard_ahead.MAX_AHEAD`` queued there, a trajectory's own variance absorbed).
    Results in input order, as ``map(_work, jobs)`` gives them, figure for figure."""
    it = iter(jobs)
    queue: deque[list[Any]] = deque()  # [job, what send_ahead sent for it or None]

    def fill() -> None:  # the records read ahead: one more than may be sent
        while len(queue) <= MAX_AHEAD:
            job = next(it, None)
            if job is None:
                return
            queue.append([job, None])

    def then() -> None:  # sent in input order: the first that cannot go stops the rest
        for item in queue:
            if item[1] is None:
                item[1] = send_ahead(item[0][2], _WORKER["settings"], _WORKER["envs"])
                if item[1] is None:
                    return

    fill()
    while queue:
        job, ahead = queue.popleft()
        fill()
        yield _work(job, ahead, then)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _jobs(paths: Iterable[str], skipped: list[dict], counts: dict[str, int],
          shard: tuple[int, int] | None = None) -> Iterator[Job]:
    """The records to audit, in input order (``shard`` (I, N): only shard I's, ``audit.shard``;
    what has no id, shard 0 reports)."""
    first: dict[str, int] = {}  # id -> where it was first read: file index << 40 | line
    files: list[str] = []
    mine = shard is None or shard[0] == UNREADABLE_OWNER
    for p in paths:
        if not Path(p).exists():
            if mine:
                skipped.append(skipped_row(str(p), None, "file not found"))
            continue
        try:
            for item in read_trajectories(p):
                traj = item.trajectory
                if traj is not None and shard is not None and \
                        shard_of(traj.id, shard[1]) != shard[0]:
                    continue  # another shard's record
                if traj is None and not mine:
                    continue
                counts["read"] += 1
                if traj is None:
                    skipped.append(skipped_row(item.path, item.line, item.error))
                    continue
                if traj.id in first:
                    f, ln = files[first[traj.id] >> 40], first[traj.id] & ((1 << 40) - 1)
                    skipped.append(skipped_row(
                        item.path, item.line, f"duplicate trajectory id {traj.id!r:.80} (first "
                                              f"at {f}:{ln}, which is audited); skipped"))
                    continue
                if not files or files[-1] != item.path:
                    files.append(item.path)
                first[traj.id] = (len(files) - 1) << 40 | item.line
                yield item.path, item.line, traj, item.maybe_nonfinite
        except OSError as exc:
            if mine:
                skipped.append(skipped_row(p, None, f"cannot read: {exc.strerror or exc}"))


def input_order(inputs: list[str]) -> Callable[[dict[str, Any]], tuple[int, float]]:
    """The sort key of a skipped record or warning by its place in the input: (the input's
    index, its line; a whole file's entry after that file's lines): what the audit lists."""
    index = {}
    for i, p in enumerate(inputs):
        index.setdefault(str(p), i)

    def key(row: dict[str, Any]) -> tuple[int, float]:
        line = row.get("line")
        return index.get(str(row.get("file")), len(index)), (math.inf if line is None else line)

    return key


#: records a worker replays in turn, as one process does (``_work_in_turn``: its environment's
#: process runs the next ones while it scores)
CHUNK = 8


def _work_chunk(jobs: list[Job]) -> list[tuple[str, int, _Done | str]]:
    return list(_work_in_turn(iter(jobs)))


def _chunks(jobs: Iterator[Job], n: int) -> Iterator[list[Job]]:
    chunk: list[Job] = []
    for job in jobs:
        chunk.append(job)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Pool:
    """Worker processes that die with this one, results in input order, a bounded window;
    each worker replays :data:`CHUNK` consecutive records at a time."""

    def __init__(self, opts: AuditOptions, triples: list[Triple] | None) -> None:
        self.args = (os.getpid(), opts, triples)
        self.n = opts.workers
        self.ex = self._start()

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.n, initializer=_pool_init, initargs=self.args)

    def map(self, jobs: Iterator[Job]) -> Iterator[tuple[str, int, Any]]:
        pending: deque[tuple[list[Job], Future]] = deque()
        for chunk in _chunks(jobs, CHUNK):
            pending.append((chunk, self._submit(_work_chunk, chunk)))
            if len(pending) >= 2 * self.n:
                yield from self._results(*pending.popleft())
        while pending:
            yield from self._results(*pending.popleft())

    def _submit(self, fn: Callable[[Any], Any], arg: Any) -> Future:
        try:
            return self.ex.submit(fn, arg)
        except BrokenProcessPool:  # a worker died: a fresh pool
            self._restart()
            return self.ex.submit(fn, arg)

    def _restart(self) -> None:
        """A fresh pool, unless the current one still works (an older pool broke)."""
        if getattr(self.ex, "_broken", True) is False:
            return
        self.ex.shutdown(wait=False, cancel_futures=True)
        self.ex = self._start()

    def _results(self, chunk: list[Job], fut: Future) -> Iterator[tuple[str, int, Any]]:
        """The chunk's results. When a worker died with it in flight (or it could not be
        sent), each of its records is replayed once more, alone, in a fresh pool: only the
        record that kills a worker again is lost, never the records that merely shared the
        pool or the chunk with it."""
        try:
            yield from fut.result()
            return
        except BrokenProcessPool:
            self._restart()
        except Exception:  # noqa: BLE001 - e.g. a record that could not be sent: each alone
            pass
        for job in chunk:
            yield self._alone(job)

    def _alone(self, job: Job) -> tuple[str, int, Any]:
        path, line = job[0], job[1]
        try:
            return self._submit(_work, job).result()
        except BrokenProcessPool:
            self._restart()
            return path, line, "not audited: a worker process died replaying this record"
        except Exception as exc:
            return path, line, f"replay failed: {type(exc).__name__}: {_one_line(exc)}"

    def close(self, cancel: bool) -> None:
        """Wait for the workers; ``cancel`` (Ctrl-C, an error): kill them instead, so that a
        call in flight (an environment call up to its limit) does not hold the exit."""
        if cancel:
            for proc in list((getattr(self.ex, "_processes", None) or {}).values()):
                with contextlib.suppress(OSError, AttributeError):
                    proc.kill()
            self.ex.shutdown(wait=False, cancel_futures=True)
            return
        self.ex.shutdown(wait=True)


# ---------------------------------------------------------------- the audit


def run_audit(inputs: list[str], out_dir: str | os.PathLike[str],
              opts: AuditOptions | None = None) -> dict[str, Any]:
    """Replay, score and summarise; write the audit directory; return the summary.

    Raises :class:`envace.core.errors.UsageError` (nothing written) for an output that may not be
    written (``audit.store.output``) or a ``--reference`` with nothing usable.
    """
    opts = opts or AuditOptions()
    if opts.override and not opts.reference:
        raise UsageError("auditing a reference needs --reference TRAIN.jsonl")
    if opts.shard is not None:
        check_shard_inputs(inputs)
    try:
        opts.verdict  # noqa: B018 (validates the scorer and the threshold)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    with AuditWriter(out_dir, [*inputs, opts.reference]) as w:
        triples, ref_report = read_reference(opts.reference) if opts.reference else (None, None)
        summary = _audit_into(w, inputs, opts, triples)
        if ref_report is not None:
            summary["reference_counts"] = {k: ref_report[k] for k in
                                           ("records_read", "trajectories", "calls")}
            summary["reference_skipped_records"] = ref_report["skipped_records"]
        if opts.shard is not None:
            summary["shard"] = shard_block(*opts.shard, inputs, opts)
        return w.finish(summary, plots=opts.plots)


def _audit_into(w: AuditWriter, inputs: list[str], opts: AuditOptions,
                triples: list[Triple] | None) -> dict[str, Any]:
    skipped: list[dict] = []
    warnings: list[dict] = []
    counts = {"read": 0}
    agg = SummaryAggregator(opts)  # the statistics' running aggregates (flat memory)
    trajectories = 0
    t0 = time.perf_counter()
    bar = _progress(opts.progress)
    jobs = _jobs(inputs, skipped, counts, opts.shard)
    pool = None
    if opts.workers > 1:
        pool = _Pool(opts, triples)
        results: Iterable = pool.map(jobs)
    else:
        _setup_worker(opts, triples)
        results = _work_in_turn(jobs)
    done = False
    try:
        for path, line, res in results:
            if isinstance(res, str):
                skipped.append(skipped_row(path, line, res))
                continue
            trajectories += 1
            for msg in res.warnings:
                warnings.append({"file": path, "line": line,
                                 "trajectory_id": res.trajectory_id, "message": msg})
            w.write_lines(res.steps_text, res.traj_text)
            agg.add(res.rows)
            bar.update(res.n_steps)
        done = True
    finally:
        bar.close()
        if pool is not None:
            pool.close(cancel=not done)
        if not done:
            agg.close()
    # records read ahead (unreadable lines are listed as they are read) and workers answer
    # ahead of a record's failed replay: back to input order
    skipped.sort(key=input_order(inputs))
    return agg.summary(trajectories=trajectories, read=counts["read"], skipped=skipped,
                       warnings=warnings, inputs=inputs, seconds=time.perf_counter() - t0)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(desc="audit", unit="step", file=sys.stderr, leave=False)
