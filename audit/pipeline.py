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
as the floats they are and named in ``warnings`` with their file, line and field. The work
on each record (replay, scores, its lines) is ``audit.workers``'s.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from audit.scoring.settings import AuditOptions
from audit.shard import UNREADABLE_OWNER, shard_block, shard_of
from audit.shard import check_inputs as check_shard_inputs
from audit.stats.aggregate import SummaryAggregator
from audit.store.models import place, skipped_row
from audit.store.output import AuditWriter
from audit.workers import (
    GC_YOUNG,
    Done,
    Job,
    Pool,
    RawJob,
    Read,
    Triple,
    nonfinite_paths,
    setup_worker,
    work_in_turn,
)
from envace.core.errors import UsageError
from envace.core.schema import READ_BUFFER_BYTES, bounded_lines, read_trajectories

__all__ = ["read_reference", "reference_triples", "run_audit", "nonfinite_paths"]


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


class _Admit:
    """Which records the audit audits, as it reads them in input order: one per trajectory id
    (the first; a later one is skipped as a duplicate), this shard's only (``audit.shard``;
    unreadable lines are shard ``UNREADABLE_OWNER``'s to report), each counted as read. What
    it skips it keeps with its place in the input (``seq``: the line's, in the order the
    inputs are read, a file named twice twice), so that :meth:`skipped` lists them in input
    order whatever order they were found in."""

    def __init__(self, counts: dict[str, int], shard: tuple[int, int] | None) -> None:
        self.counts, self.shard = counts, shard
        self.first: dict[str, int] = {}  # id -> where it was first read: file index << 40 | line
        self.files: list[str] = []
        #: whether this audit reports what belongs to no shard (a missing file, a bad line)
        self.mine = shard is None or shard[0] == UNREADABLE_OWNER
        self.seq = 0  # lines (and whole files) read so far
        self._rows: list[tuple[int, dict[str, Any]]] = []
        #: the places of the admitted records whose results have not come back yet
        self.pending: deque[int] = deque()
        #: hashes of the lines handed out so far (``_lines``: a repeated line is a copy)
        self.hashes: set[int] = set()

    def next(self) -> int:
        self.seq += 1
        return self.seq

    def problem(self, path: str, line: int | None, why: str, seq: int) -> None:
        """A file or line that cannot be read."""
        if self.mine:
            self.counts["read"] += line is not None
            self._rows.append((seq, skipped_row(path, line, why)))

    def admit(self, path: str, line: int, tid: str, seq: int) -> bool:
        """Count this shard's record as read; whether it is the first with its id (then its
        result is awaited: ``pending``)."""
        self.counts["read"] += 1
        if tid in self.first:
            at = self.first[tid]
            f, ln = self.files[at >> 40], at & ((1 << 40) - 1)
            self._rows.append((seq, skipped_row(
                path, line, f"duplicate trajectory id {tid!r:.80} (first at {f}:{ln}, which is "
                            "audited); skipped")))
            return False
        if not self.files or self.files[-1] != path:
            self.files.append(path)
        self.first[tid] = (len(self.files) - 1) << 40 | line
        self.pending.append(seq)
        return True

    def failed(self, path: str, line: int, why: str) -> None:
        """The next awaited record could not be audited."""
        self._rows.append((self.pending.popleft(), skipped_row(path, line, why)))

    def audited(self) -> None:
        """The next awaited record was audited."""
        self.pending.popleft()

    def skipped(self) -> list[dict[str, Any]]:
        """Every skipped line and file, in input order."""
        return [row for _, row in sorted(self._rows, key=lambda kv: kv[0])]


def _jobs(paths: Iterable[str], admit: _Admit) -> Iterator[Job]:
    """The records to audit, parsed here, in input order."""
    shard = admit.shard
    for p in paths:
        if not Path(p).exists():
            admit.problem(str(p), None, "file not found", admit.next())
            continue
        try:
            for item in read_trajectories(p):
                traj, seq = item.trajectory, admit.next()
                if traj is None:
                    admit.problem(item.path, item.line, str(item.error), seq)
                elif (shard is None or shard_of(traj.id, shard[1]) == shard[0]) and \
                        admit.admit(item.path, item.line, traj.id, seq):
                    yield item.path, item.line, traj, item.maybe_nonfinite, item.size
        except OSError as exc:
            admit.problem(p, None, f"cannot read: {exc.strerror or exc}", admit.next())


def _lines(paths: Iterable[str], admit: _Admit) -> Iterator[RawJob]:
    """Every line of the inputs, unread, for a pool's workers to read (``audit.workers``); a
    line whose bytes repeat an earlier line's is marked a ``copy`` (its record, if it is one,
    repeats an id: the worker does not replay it)."""
    for p in paths:
        if not Path(p).exists():
            admit.problem(str(p), None, "file not found", admit.next())
            continue
        try:
            with open(p, "rb", buffering=READ_BUFFER_BYTES) as fh:
                for lineno, raw, too_long in bounded_lines(fh):
                    h = hash(raw)
                    copy = not too_long and h in admit.hashes
                    admit.hashes.add(h)
                    yield RawJob(str(p), lineno, raw, too_long, admit.next(), copy)
        except OSError as exc:
            admit.problem(p, None, f"cannot read: {exc.strerror or exc}", admit.next())


def _admitted(reads: Iterable[tuple[RawJob, Read]], admit: _Admit,
              pool: Pool) -> Iterator[tuple[str, int, Done | str]]:
    """The workers' results of the records the audit audits, in input order. A record the
    worker presumed a duplicate that is the first with its id after all (a hash collision,
    or a worker that read a later line first: a retry) is audited now, on its own."""
    for job, r in reads:
        if r.blank:
            continue
        if r.error is not None:
            admit.problem(r.path, r.line, r.error, r.seq)
        elif r.mine and r.trajectory_id is not None and admit.admit(r.path, r.line,
                                                                      r.trajectory_id, r.seq):
            if r.presumed_duplicate:
                r = pool.alone(job)
            yield r.path, r.line, r.result if r.result is not None else "not audited"


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
    warnings: list[dict] = []
    counts = {"read": 0}
    agg = SummaryAggregator(opts)  # the statistics' running aggregates (flat memory)
    trajectories = 0
    t0 = time.perf_counter()
    bar = _progress(opts.progress)
    admit = _Admit(counts, opts.shard)
    pool = None
    if opts.workers > 1:  # the workers read the lines: this process parses nothing
        pool = Pool(opts, triples)
        results: Iterable = _admitted(pool.map(_lines(inputs, admit)), admit, pool)
    else:
        setup_worker(opts, triples)
        results = work_in_turn(_jobs(inputs, admit))
    done = False
    try:
        with _fewer_collections():  # the records stream
            for path, line, res in results:
                if isinstance(res, str):
                    admit.failed(path, line, res)
                    continue
                admit.audited()
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
    return agg.summary(trajectories=trajectories, read=counts["read"], skipped=admit.skipped(),
                       warnings=warnings, inputs=inputs, seconds=time.perf_counter() - t0)


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """The cyclic garbage collector's youngest generation collected every :data:`GC_YOUNG`
    allocations rather than every 700, while the records stream: every record's objects
    (thousands, freed by reference counting) triggered collections that walked the records
    in flight (issue 44: 2 % of the audit's CPU). The threshold is restored after."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], GC_YOUNG), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


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
