"""The audit's work on its records, in this process or in worker processes (``--workers N``).

    for path, line, res in work_in_turn(jobs):          # one process: parsed records in
        ...                                             # res: Done (its lines and rows) or why not
    pool = Pool(opts, triples)
    for job, read in pool.map(raw_jobs):                # N processes: the file's lines in
        ...                                             # Read: what a worker made of one line

One process (``work_in_turn``) replays the records its reader parsed, the calls of the next ones
sent ahead to the environment's process while it scores (``audit.replay.send_ahead``). A pool's
workers are handed the lines themselves (bytes, ``RawJob``): each reads, parses, checks its
shard and replays :data:`CHUNK` consecutive lines at a time, so the parent, which writes, keeps
the statistics and decides which records are audited (``audit.pipeline``: one per id, in input
order), parses nothing (issue 44: it had parsed every record and sent it on, the pool's serial
bottleneck). A worker that dies costs only the record that kills it again (``Pool``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import re
import signal
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from audit.replay import ReplayError, replay_trajectory, send_ahead
from audit.scoring.settings import AuditOptions, Override
from audit.shard import shard_of
from audit.stats.summary import compact
from audit.store.step_rows import step_line
from audit.worlds.reference import REFERENCE_NAMES, build_reference
from envace.core.envs.guard_ahead import MAX_AHEAD
from envace.core.schema import MAX_LINE_BYTES, Trajectory, json_text, read_line

__all__ = ["CHUNK", "GC_YOUNG", "Done", "Job", "Pool", "RawJob", "Read", "Triple",
           "nonfinite_paths", "setup_worker", "work_in_turn"]

Triple = tuple[str, dict, str]
_WORKER: dict[str, Any] = {}
#: allocations between two collections of the garbage collector's youngest generation while
#: records stream (CPython's default: 700; ``audit.pipeline``, and a pool's workers)
GC_YOUNG = 10_000


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
class Done:
    """One audited trajectory, serialised: the lines to write and the rows to keep."""

    steps_text: str
    traj_text: str
    rows: list[dict[str, Any]]
    warnings: list[str]
    trajectory_id: str
    n_steps: int


def setup_worker(opts: AuditOptions, triples: list[Triple] | None) -> None:
    refs: dict[str, Override] = {}
    if triples is not None:
        refs = {n: build_reference(n, triples) for n in REFERENCE_NAMES}
    override = refs.get(opts.override) if opts.override else None
    _WORKER.update(
        settings=replace(opts, references={} if override else refs),
        override=override,
        envs={},
        #: the ids of this shard's records a pool's worker has read (``_read``: duplicates)
        seen=set(),
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
    young, *older = gc.get_threshold()  # this process only streams records
    gc.set_threshold(max(young, GC_YOUNG), *older)
    setup_worker(opts, triples)


#: one record to audit: (file, line, trajectory, whether its line may hold a non-finite number,
#: the line's bytes or None: ``audit.replay.sizes_certain``)
Job = tuple[str, int, Trajectory, bool, int | None]


def _work(job: Job, ahead: Any = None, then: Callable[[], None] | None = None
          ) -> tuple[str, int, Done | str]:
    path, line, traj, maybe_nonfinite, size = job
    try:
        res = replay_trajectory(traj, _WORKER["settings"], _WORKER["envs"], _WORKER["override"],
                                ahead=ahead, then=then, line_bytes=size)
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
    return path, line, Done(steps_text, traj_text, rows, warnings, traj.id, len(res.steps))


def work_in_turn(jobs: Iterator[Job]) -> Iterator[tuple[str, int, Done | str]]:
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
                item[1] = send_ahead(item[0][2], _WORKER["settings"], _WORKER["envs"],
                                     line_bytes=item[0][4])
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


#: lines a worker reads and replays in turn, as one process does (``work_in_turn``: its
#: environment's process runs the next ones while it scores)
CHUNK = 8

class RawJob(NamedTuple):
    """One line for a pool's worker to read and, if it is a record of this shard, audit."""

    path: str
    line: int
    raw: bytes  #: the line (empty when it passed the line limit)
    too_long: bool  #: whether it passed the line limit (``envace.core.schema.bounded_lines``)
    seq: int  #: its place in the input (the order of ``skipped_records``)
    #: the same bytes as an earlier line (a record there repeats an id: not replayed)
    copy: bool = False
    #: whether the worker may leave a presumed duplicate unreplayed (False: replay it)
    dedup: bool = True


@dataclass
class Read:
    """What a worker made of one line: nothing (``blank``), or why it is unreadable
    (``error``), or the record's ``trajectory_id``, whether it is in this audit's shard
    (``mine``) and, when it is, what its audit gave (``result``: :class:`Done`, or why not;
    None with ``presumed_duplicate``: an earlier line had its id, so it was not replayed)."""

    path: str
    line: int
    seq: int
    trajectory_id: str | None = None
    error: str | None = None
    blank: bool = False
    mine: bool = True
    result: Done | str | None = None
    presumed_duplicate: bool = False


def _read(job: RawJob, shard: tuple[int, int] | None,
          seen: set[str] | None = None) -> tuple[Read, Job | None]:
    """The line read as the audit reads it (``read_line``), and the job to audit it, if any
    (``shard``: (I, N), this audit's shard of the records, ``audit.shard``). ``seen``: the
    ids of this shard's records the worker read before (it reads its lines in input order):
    a record repeating one, or whose line repeats an earlier line, is a duplicate the parent
    skips, so it is not replayed (the parent replays it after all if it is not)."""
    item = read_line(job.path, job.line, job.raw, job.too_long)
    if item is None:
        return Read(job.path, job.line, job.seq, blank=True), None
    traj = item.trajectory
    if traj is None:
        return Read(job.path, job.line, job.seq, error=item.error), None
    mine = shard is None or shard_of(traj.id, shard[1]) == shard[0]
    r = Read(job.path, job.line, job.seq, trajectory_id=traj.id, mine=mine)
    if not mine:
        return r, None
    if job.dedup and seen is not None:
        if job.copy or traj.id in seen:
            r.presumed_duplicate = True
            return r, None
        seen.add(traj.id)
    return r, (job.path, job.line, traj, item.maybe_nonfinite, item.size)


def _work_lines(jobs: list[RawJob]) -> list[Read]:
    """A worker's chunk: each line read, and this shard's records replayed in turn."""
    shard = _WORKER["settings"].shard
    seen = _WORKER["seen"]
    reads = [_read(job, shard, seen) for job in jobs]
    todo = [(r, job) for r, job in reads if job is not None]
    for (r, _), (_, _, res) in zip(todo, work_in_turn(iter([j for _, j in todo])),
                                   strict=True):
        r.result = res
    return [r for r, _ in reads]


def _chunks(jobs: Iterator[RawJob], n: int) -> Iterator[list[RawJob]]:
    chunk: list[RawJob] = []
    for job in jobs:
        chunk.append(job)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class Pool:
    """Worker processes that die with this one, results in input order, a bounded window;
    each worker reads and replays :data:`CHUNK` consecutive lines at a time."""

    def __init__(self, opts: AuditOptions, triples: list[Triple] | None) -> None:
        self.args = (os.getpid(), opts, triples)
        self.n = opts.workers
        self.ex = self._start()

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.n, initializer=_pool_init, initargs=self.args)

    def map(self, jobs: Iterator[RawJob]) -> Iterator[tuple[RawJob, Read]]:
        pending: deque[tuple[list[RawJob], Future]] = deque()
        for chunk in _chunks(jobs, CHUNK):
            pending.append((chunk, self._submit(_work_lines, chunk)))
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

    def _results(self, chunk: list[RawJob], fut: Future) -> Iterator[tuple[RawJob, Read]]:
        """The chunk's results. When a worker died with it in flight (or it could not be
        sent), each of its lines is read and replayed once more, alone, in a fresh pool: only
        the record that kills a worker again is lost, never the records that merely shared
        the pool or the chunk with it."""
        try:
            yield from zip(chunk, fut.result(), strict=True)
            return
        except BrokenProcessPool:
            self._restart()
        except Exception:  # noqa: BLE001 - e.g. a record that could not be sent: each alone
            pass
        for job in chunk:
            yield job, self.alone(job)

    def alone(self, job: RawJob) -> Read:
        """``job`` read and audited on its own, replayed even if presumed a duplicate."""
        job = job._replace(dedup=False)
        try:
            return self._submit(_work_lines, [job]).result()[0]
        except BrokenProcessPool:
            self._restart()
            why = "not audited: a worker process died replaying this record"
        except Exception as exc:  # noqa: BLE001
            why = f"replay failed: {type(exc).__name__}: {_one_line(exc)}"
        # read here what the worker could not answer: an unreadable line, another shard's
        # record or a duplicate id is reported as such, not as the failure
        r, todo = _read(job, self.args[1].shard)  # dedup=False: never presumed a duplicate
        if todo is not None:
            r.result = why
        return r

    def close(self, cancel: bool) -> None:
        """Wait for the workers; ``cancel`` (Ctrl-C, an error): kill them instead, so that a
        call in flight (an environment call up to its limit) does not hold the exit."""
        if cancel:
            procs = list((getattr(self.ex, "_processes", None) or {}).values())
            for proc in procs:
                with contextlib.suppress(OSError, AttributeError):
                    proc.kill()
            for proc in procs:
                with contextlib.suppress(OSError, AttributeError, AssertionError):
                    proc.join(5)
            _unblock(self.ex)  # before shutdown, which drops the executor's queues
            manager = getattr(self.ex, "_executor_manager_thread", None)
            self.ex.shutdown(wait=False, cancel_futures=True)
            if manager is not None:  # ended here, not raced by the interpreter's exit (which
                manager.join(5)  # can write to a wakeup pipe it closes: a traceback)
            return
        self.ex.shutdown(wait=True)


def _unblock(ex: ProcessPoolExecutor) -> None:
    """After its workers were killed, let ``ex``'s manager thread end, so that the interpreter's
    exit, which joins it, does not hang (Ctrl-C with ``--workers 2``: CI, issue 44). A worker
    killed while it wrote a result leaves part of a message in the result pipe, and the manager
    thread waits in ``recv`` for the rest: this process holds the pipe's other write end, so
    the workers' deaths alone never end that wait. Closing it gives the manager an end of file;
    it then marks the pool broken and cleans up as CPython does for a dead worker (it closes the
    call pipe's read end, which frees a feeder thread blocked on a full call pipe). Nothing else
    closes this end before ``shutdown`` drops it, so no other thread can close it twice. CPython
    keeps it in private attributes (3.11-3.13); where they are missing, nothing is done."""
    with contextlib.suppress(AttributeError, AssertionError):
        ex._call_queue.cancel_join_thread()  # never wait at exit for what it could not send
    with contextlib.suppress(AttributeError, OSError):
        ex._result_queue._writer.close()
