"""``envace-audit merge``: the shards of one audit (``--shard I/N``, ``audit.shard``) as the audit
a single run gives.

    summary = merge_shards(["shards/0", "shards/1"], "audit")

Every step row and trajectory row is copied byte for byte, in the single run's order (by input
and line: each shard's rows are already in that order, so the shards are merged, not sorted);
skipped records and warnings are brought into that order too; every statistic is recomputed
from the merged step rows with the shards' settings (``audit.stats.summary.build_summary``), so
each figure and interval, with its seed, is the single run's. ``seconds`` is the shards' sum.

Refused with a :class:`envace.core.errors.UsageError` (exit 2, nothing written, the file and
line named): a directory that is no shard of an audit, shards of different inputs (sizes and
digests) or settings, of different counts, a missing or a repeated index, a shard whose files
disagree with each other or with its summary's counts (trajectories, steps, skipped), a
trajectory row that is not its shard's (``audit.shard.shard_of``: a relabelled copy) or whose id
was given before, a shard ``summary.json`` that is not of the types the audit writes
(:class:`audit.store.models.AuditSummary` and the shard block, checked before anything is read
further), a line of ``steps.jsonl`` that is no step row or of ``trajectories.jsonl`` that is no
trajectory row, a file that is not a regular file (a FIFO is never waited on) and a summary over
:data:`MAX_SUMMARY_BYTES`. Missing shards are counted, not enumerated (``N`` may be up to
``audit.shard.MAX_SHARDS``).
The output is written like every audit (``audit.store.output``: locked, all or nothing).
"""

from __future__ import annotations

import heapq
import json
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, ValidationError

from audit.pipeline import input_order
from audit.scoring.scorers import list_scorers
from audit.scoring.settings import AuditOptions
from audit.shard import MAX_SHARDS, SHARD_SCHEMA, shard_of
from audit.stats.clusters import check_unit
from audit.stats.summary import build_summary, compact
from audit.store.models import AuditSummary
from audit.store.output import AuditWriter
from audit.store.records import MAX_SUMMARY_BYTES
from audit.store.step_rows import step_problem
from envace.core.errors import UsageError
from envace.core.infile import read_small_text
from envace.core.layout import AUDIT
from envace.core.schema import MAX_LINE_BYTES, bounded_lines

__all__ = ["MAX_COUNT", "MAX_SUMMARY_BYTES", "merge_shards", "read_shards"]

_SAME = ("count", "inputs", "settings")
_SHOWN = 10  # missing shards named in a refusal
_STRICT = ConfigDict(strict=True, extra="allow")
#: the largest count or line number a shard's summary may state (int64, as every reader of an
#: audit holds it); the counts must also be what the shard's files hold
MAX_COUNT = 2**63 - 1
_COUNTED = ("trajectories", "records_read", "skipped", "steps")


class _Digest(BaseModel):
    """An input of a shard: its name, size and digest (``audit.shard.file_digest``)."""

    model_config = _STRICT
    file: str
    bytes: int = Field(ge=0)
    blake2b: str


class _Settings(BaseModel):
    """The settings of a shard that merge reads (``audit.shard.shard_block``)."""

    model_config = _STRICT
    scorers: list[str]
    verdict_scorer: str
    verdict_threshold: int | FiniteFloat
    cluster_by: str | None = None
    reference: _Digest | None = None
    override: str | None = None
    plots: bool = True


class _ShardBlock(BaseModel):
    """The ``shard`` block of a shard's ``summary.json``, as merge reads it."""

    model_config = _STRICT
    index: int = Field(ge=0)
    count: int = Field(ge=1, le=MAX_SHARDS)
    inputs: list[_Digest]
    settings: _Settings


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading, refused (``UsageError``) unless it is a regular file: opening
    a FIFO does not wait for a writer, a device is not read (``envace.core.infile`` reads a
    small file whole; these are read a line at a time)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path} is not a regular file (a FIFO, a device or a directory): "
                             "refusing to read it")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _place(data: Any, loc: tuple[Any, ...], missing: bool) -> tuple[str, bool]:
    """The dotted path of a validation error's place in ``data``, and whether the error's
    location went on past it (into the members of a union of types)."""
    parts = []
    for p in loc:
        inside = (isinstance(data, dict) and isinstance(p, str) and p in data
                  or isinstance(data, list) and isinstance(p, int) and 0 <= p < len(data))
        if inside:
            data = data[p]
        elif not (missing and isinstance(data, dict) and isinstance(p, str)):
            break
        parts.append(str(p))
    return ".".join(parts) or "(summary)", len(parts) < len(loc)


def _invalid(path: Path, data: Any, exc: ValidationError, prefix: tuple[str, ...] = ()
             ) -> UsageError:
    err = exc.errors(include_url=False)[0]
    missing = err["type"] == "missing"
    where, union = _place(data, (*prefix, *err["loc"]), missing)
    got = type(err.get("input")).__name__
    what = ("is missing" if missing else f"is {got}, of no type it may have" if union
            else f"is {got}: {err['msg']}")
    return UsageError(f"{path}: {where} {what} (a damaged or edited shard: audit it again)")


def _check(path: Path, data: dict[str, Any]) -> None:
    """A shard's summary as merge reads it: the typed summary (``AuditSummary``), its shard
    block, the counts merge adds up and the settings it recomputes with."""
    try:
        summary = AuditSummary.model_validate(data)
    except ValidationError as exc:
        raise _invalid(path, data, exc) from None
    except RecursionError:
        raise UsageError(f"{path}: nested too deeply") from None
    try:
        block = _ShardBlock.model_validate(data["shard"])
    except ValidationError as exc:
        raise _invalid(path, data, exc, ("shard",)) from None
    if block.index >= block.count:
        raise UsageError(f"{path}: shard.index {block.index} is not below shard.count "
                         f"{block.count}")
    _check_counts(path, data, summary)
    if summary.inputs != [i.file for i in block.inputs]:
        raise UsageError(f"{path}: inputs disagree with shard.inputs")
    try:
        float(summary.seconds or 0)
    except OverflowError:
        raise UsageError(f"{path}: seconds is too large a number") from None
    cfg = block.settings
    unknown = sorted(set(cfg.scorers) - set(list_scorers()))
    if unknown:
        raise UsageError(f"{path}: shard.settings.scorers names unknown scorer(s) "
                         f"{', '.join(unknown)}")
    try:
        _options(cfg).verdict  # noqa: B018  (raises ValueError for a rule that cannot be)
    except ValueError as exc:
        raise UsageError(f"{path}: shard.settings: {exc}") from None
    if cfg.cluster_by is not None and (err := check_unit(cfg.cluster_by)):
        raise UsageError(f"{path}: shard.settings.cluster_by: {err}")


def _check_counts(path: Path, data: dict[str, Any], summary: AuditSummary) -> None:
    """The counts merge adds up, bounded, and agreeing with the summary's own lists: as many
    skipped as ``skipped_records`` lists, and between ``trajectories`` and ``trajectories +
    skipped`` records read (a record read is audited or skipped; an input that is missing or
    unreadable is skipped unread). That they are what the shard's files hold is checked as the
    files are read (:func:`_trajectory_lines`, :meth:`_Steps.check_done`)."""
    counts = summary.counts
    if counts is None:
        raise UsageError(f"{path}: counts is missing")
    for k in _COUNTED:
        value = getattr(counts, k)
        if value is None or not 0 <= value <= MAX_COUNT:
            raise UsageError(f"{path}: counts.{k} is missing, negative or past {MAX_COUNT} "
                             "(a damaged or edited shard: audit it again)")
    for k in ("skipped_records", "warnings"):
        for n, rec in enumerate(data.get(k) or []):
            line = rec.get("line") if isinstance(rec, dict) else None
            if line is not None and not 0 <= line <= MAX_COUNT:
                raise UsageError(f"{path}: {k}.{n}.line is no line number")
    listed = len(data.get("skipped_records") or [])
    if counts.skipped != listed:
        raise UsageError(f"{path}: counts.skipped is {counts.skipped} but skipped_records lists "
                         f"{listed} (a damaged or edited shard: audit it again)")
    if not counts.trajectories <= counts.records_read <= counts.trajectories + counts.skipped:
        raise UsageError(f"{path}: counts.records_read {counts.records_read} is not between "
                         f"counts.trajectories {counts.trajectories} and that plus "
                         f"counts.skipped {counts.skipped} (a damaged or edited shard: audit "
                         "it again)")


def _summary(d: Path) -> dict[str, Any]:
    path = d / AUDIT.summary
    if not os.path.lexists(path):
        raise UsageError(f"{d} is not an audit directory (no {AUDIT.summary})")
    text = read_small_text(path, MAX_SUMMARY_BYTES, "shard summary")  # no FIFO waited on
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    block = data.get("shard") if isinstance(data, dict) else None
    if not isinstance(block, dict) or block.get("schema") != SHARD_SCHEMA:
        raise UsageError(f"{d} is not a shard of an audit (its {AUDIT.summary} has no shard "
                         "block: audit with `envace-audit replay ... --shard I/N`)")
    for f in (AUDIT.steps, AUDIT.trajectories):
        if not (d / f).is_file():
            raise UsageError(f"shard {d} has no {f}")
    _check(path, data)
    return data


def _missing(count: int, present: set[int]) -> str:
    """Which of ``count`` shards are not in ``present`` (all below ``count``): how many, and the
    first few, without walking ``range(count)``."""
    shown: list[int] = []
    i = 0
    while len(shown) < _SHOWN and i < count:  # at most len(present) + _SHOWN turns
        if i not in present:
            shown.append(i)
        i += 1
    n = count - len(present)
    names = ", ".join(f"{i}/{count}" for i in shown)
    more = f" and {n - len(shown)} more" if n > len(shown) else ""
    return f"shard(s) {names}{more} missing ({n} of {count}): merge needs all {count}"


def read_shards(dirs: Sequence[str | os.PathLike[str]]) -> list[tuple[Path, dict[str, Any]]]:
    """The shards' directories and summaries, in index order, checked to be one whole audit."""
    if not dirs:
        raise UsageError("merge needs the shard directories")
    shards = [(Path(d), _summary(Path(d))) for d in dirs]
    first_dir, first = shards[0]
    for d, s in shards[1:]:
        for key in _SAME:
            if s["shard"].get(key) != first["shard"].get(key):
                what = {"count": "shard counts", "inputs": "inputs (names, sizes or digests)",
                        "settings": "settings"}[key]
                raise UsageError(f"shards {first_dir} and {d} differ in their {what}: they are "
                                 "not shards of one audit")
    count = first["shard"]["count"]
    by_index: dict[int, Path] = {}
    for d, s in shards:
        i = s["shard"]["index"]
        if i in by_index:
            raise UsageError(f"shard {i}/{count} is given twice ({by_index[i]} and {d})")
        by_index[i] = d
    if len(by_index) < count:
        raise UsageError(_missing(count, set(by_index)))
    return sorted(shards, key=lambda ds: ds[1]["shard"]["index"])


def _options(cfg: _Settings) -> AuditOptions:
    return AuditOptions(scorers=list(cfg.scorers), verdict_scorer=cfg.verdict_scorer,
                        verdict_threshold=cfg.verdict_threshold, cluster_by=cfg.cluster_by,
                        reference=None if cfg.reference is None else cfg.reference.file,
                        override=cfg.override, plots=cfg.plots, progress=False)


def _decoded(raw: bytes, where: str) -> tuple[str, Any]:
    """A line's text and JSON value, or ``UsageError`` naming ``where`` (file:line)."""
    try:
        text = raw.decode("utf-8")
        return text, json.loads(text)
    except UnicodeDecodeError as exc:
        raise UsageError(f"{where}: not UTF-8 at byte {exc.start}") from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{where}: not JSON ({exc})") from None


def _row_problem(row: Any) -> str | None:
    """Why a decoded ``trajectories.jsonl`` line cannot be merged, or None."""
    if not isinstance(row, dict):
        return f"a trajectory row must be a JSON object, got {type(row).__name__}"
    tid = row.get("trajectory_id")
    if not isinstance(tid, str):
        return f"trajectory_id must be a string, got {type(tid).__name__}"
    steps, line = row.get("steps"), row.get("line")
    if steps is not None and (type(steps) is not int or steps < 0):
        return f"steps must be a count of steps, got {steps!r}"[:200]
    if line is not None and type(line) is not int:
        return f"line must be a line number, got {line!r}"[:200]
    return None


def _trajectory_lines(d: Path, shard: dict[str, Any], key: Any, seen: set[str]
                      ) -> Iterator[tuple[tuple, str, dict[str, Any]]]:
    """A shard's trajectory rows with their merge key (input, line; shard, line), each checked
    to be the shard's own (``audit.shard.shard_of``) and not given before (``seen``: the ids of
    every shard so far), and as many as its ``counts.trajectories``."""
    path = d / AUDIT.trajectories
    i, count = shard["shard"]["index"], shard["shard"]["count"]
    rows = 0
    with _open_regular(path) as fh:
        for n, raw, too_long in bounded_lines(fh):
            where = f"{path}:{n}"
            if too_long:
                raise UsageError(f"{where}: line longer than {MAX_LINE_BYTES} bytes")
            text, row = _decoded(raw, where)
            why = _row_problem(row)
            if why:
                raise UsageError(f"{where}: {why}")
            tid = row["trajectory_id"]
            if (owner := shard_of(tid, count)) != i:
                raise UsageError(f"{where}: trajectory {tid!r:.80} is shard {owner}/{count}'s, "
                                 f"not {i}/{count}'s (a relabelled or edited shard: audit it "
                                 "again)")
            if tid in seen:
                raise UsageError(f"{where}: trajectory {tid!r:.80} is given twice (a damaged "
                                 "or edited shard: audit it again)")
            seen.add(tid)
            rows += 1
            yield (key(row), i, n), text, row
    said = shard["counts"]["trajectories"]
    if rows != said:
        raise UsageError(f"{path} holds {rows} trajectory rows but its {AUDIT.summary} "
                         f"counts.trajectories is {said} (a damaged or edited shard: audit it "
                         "again)")


class _Steps:
    """A shard's ``steps.jsonl``, read a trajectory's steps at a time, every line checked."""

    def __init__(self, d: Path, said: int) -> None:
        self.path = d / AUDIT.steps
        self.fh = _open_regular(self.path)
        self.n = 0
        self.said = said  # its summary's counts.steps

    def take(self, row: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
        """The step lines (texts, records) of trajectory ``row``."""
        texts, recs = [], []
        tid = row.get("trajectory_id")
        for _ in range(row.get("steps") or 0):
            raw = self.fh.readline(MAX_LINE_BYTES + 1)
            if not raw:
                raise UsageError(f"{self.path} ends before the steps of trajectory {tid!r}")
            self.n += 1
            where = f"{self.path}:{self.n}"
            if len(raw) > MAX_LINE_BYTES:
                raise UsageError(f"{where}: line longer than {MAX_LINE_BYTES} bytes")
            text, rec = _decoded(raw, where)
            why = step_problem(rec)
            if why:
                raise UsageError(f"{where}: not a step row: {why}")
            if rec.get("trajectory_id") != tid:
                raise UsageError(f"{where}: {AUDIT.steps} and {AUDIT.trajectories} disagree at "
                                 f"trajectory {tid!r}")
            texts.append(text)
            recs.append(rec)
        return texts, recs

    def check_done(self) -> None:
        if self.fh.readline(1):
            raise UsageError(f"{self.path} holds more steps than its {AUDIT.trajectories} "
                             "counts")
        if self.n != self.said:
            raise UsageError(f"{self.path} holds {self.n} step rows but its {AUDIT.summary} "
                             f"counts.steps is {self.said} (a damaged or edited shard: audit "
                             "it again)")


def _seconds(summaries: list[dict[str, Any]]) -> float:
    total = sum(float(s.get("seconds") or 0.0) for s in summaries)
    if total != total or total in (float("inf"), float("-inf")):
        raise UsageError("the shards' seconds add up to no finite number")
    return total


def merge_shards(dirs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]
                 ) -> dict[str, Any]:
    """Write the audit of the whole input from its shards into ``out``; return its summary."""
    shards = read_shards(dirs)
    first = shards[0][1]
    inputs = list(first["inputs"])
    key = input_order(inputs)
    opts = _options(_ShardBlock.model_validate(first["shard"]).settings)
    summaries = [s for _, s in shards]
    seconds = _seconds(summaries)
    rows: list[dict[str, Any]] = []
    with AuditWriter(out, [d for d, _ in shards]) as w:
        steps: list[_Steps] = []
        try:
            for d, s in shards:
                steps.append(_Steps(d, s["counts"]["steps"]))
            seen: set[str] = set()
            merged = heapq.merge(*[_trajectory_lines(d, s, key, seen) for d, s in shards])
            for (_, i, _), text, row in merged:
                lines, recs = steps[i].take(row)
                rows.extend(compact(rec) for rec in recs)
                w.write_lines("".join(lines), text)
            for s in steps:
                s.check_done()
        finally:
            for s in steps:
                s.fh.close()
        skipped = sorted((r for s in summaries for r in s.get("skipped_records") or []), key=key)
        warnings = sorted((r for s in summaries for r in s.get("warnings") or []), key=key)
        summary = build_summary(
            rows, opts, trajectories=sum(s["counts"]["trajectories"] for s in summaries),
            read=sum(s["counts"]["records_read"] for s in summaries), skipped=skipped,
            warnings=warnings, inputs=inputs, seconds=seconds)
        if "reference_counts" in first:
            summary["reference_counts"] = first["reference_counts"]
            summary["reference_skipped_records"] = first.get("reference_skipped_records", [])
        return w.finish(summary, plots=opts.plots)
