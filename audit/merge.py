"""``envace-audit merge``: the shards of one audit (``--shard I/N``, ``audit.shard``) as the audit
a single run gives.

    summary = merge_shards(["shards/0", "shards/1"], "audit")

Every step row and trajectory row is copied byte for byte, in the single run's order (by input
and line: each shard's rows are already in that order, so the shards are merged, not sorted);
skipped records and warnings are brought into that order too; every statistic is recomputed
from the merged step rows with the shards' settings (``audit.stats.summary.build_summary``), so
each figure and interval, with its seed, is the single run's. ``seconds`` is the shards' sum.

Refused with a :class:`envace.core.errors.UsageError` (exit 2, nothing written): a directory
that is no shard of an audit, shards of different inputs (sizes and digests) or settings, of
different counts, a missing or a repeated index, or a shard whose files disagree with each other.
The output is written like every audit (``audit.store.output``: locked, all or nothing).
"""

from __future__ import annotations

import heapq
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from audit.pipeline import input_order
from audit.scoring.settings import AuditOptions
from audit.shard import SHARD_SCHEMA
from audit.stats.summary import build_summary, compact
from audit.store.output import AuditWriter
from envace.core.errors import UsageError
from envace.core.layout import AUDIT

__all__ = ["merge_shards", "read_shards"]

_SAME = ("count", "inputs", "settings")


def _summary(d: Path) -> dict[str, Any]:
    path = d / AUDIT.summary
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{d} is not an audit directory (no {AUDIT.summary})") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    block = data.get("shard") if isinstance(data, dict) else None
    if not isinstance(block, dict) or block.get("schema") != SHARD_SCHEMA:
        raise UsageError(f"{d} is not a shard of an audit (its {AUDIT.summary} has no shard "
                         "block: audit with `envace-audit replay ... --shard I/N`)")
    for f in (AUDIT.steps, AUDIT.trajectories):
        if not (d / f).is_file():
            raise UsageError(f"shard {d} has no {f}")
    return data


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
    missing = [i for i in range(count) if i not in by_index]
    if missing:
        shown = ", ".join(f"{i}/{count}" for i in missing[:10])
        raise UsageError(f"shard(s) {shown} missing: merge needs all {count}")
    return sorted(shards, key=lambda ds: ds[1]["shard"]["index"])


def _options(settings: dict[str, Any]) -> AuditOptions:
    ref = settings.get("reference")
    return AuditOptions(scorers=list(settings["scorers"]),
                        verdict_scorer=settings["verdict_scorer"],
                        verdict_threshold=settings["verdict_threshold"],
                        cluster_by=settings.get("cluster_by"),
                        reference=None if ref is None else ref["file"],
                        override=settings.get("override"), plots=settings.get("plots", True),
                        progress=False)


def _trajectory_lines(d: Path, i: int, key: Any) -> Iterator[tuple[tuple, bytes, dict[str, Any]]]:
    """Shard ``i``'s trajectory rows with their merge key (input, line; shard, line)."""
    with open(d / AUDIT.trajectories, "rb") as fh:
        for n, raw in enumerate(fh, 1):
            try:
                row = json.loads(raw)
            except ValueError as exc:
                raise UsageError(f"{d / AUDIT.trajectories}:{n}: not JSON ({exc})") from None
            yield (key(row), i, n), raw, row


def _steps_of(fh: BinaryIO, d: Path, row: dict[str, Any]) -> list[bytes]:
    lines = []
    for _ in range(int(row.get("steps") or 0)):
        raw = fh.readline()
        if not raw:
            raise UsageError(f"shard {d}: {AUDIT.steps} ends before the steps of trajectory "
                             f"{row.get('trajectory_id')!r}")
        lines.append(raw)
    return lines


def merge_shards(dirs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]
                 ) -> dict[str, Any]:
    """Write the audit of the whole input from its shards into ``out``; return its summary."""
    shards = read_shards(dirs)
    first = shards[0][1]
    inputs = list(first["inputs"])
    key = input_order(inputs)
    opts = _options(first["shard"]["settings"])
    rows: list[dict[str, Any]] = []
    with AuditWriter(out, [d for d, _ in shards]) as w:
        steps = [open(d / AUDIT.steps, "rb") for d, _ in shards]  # noqa: SIM115
        try:
            merged = heapq.merge(*[_trajectory_lines(d, i, key)
                                   for i, (d, _) in enumerate(shards)])
            for (_, i, _), raw, row in merged:
                lines = _steps_of(steps[i], shards[i][0], row)
                for line in lines:
                    rec = json.loads(line)
                    if rec.get("trajectory_id") != row.get("trajectory_id"):
                        raise UsageError(f"shard {shards[i][0]}: {AUDIT.steps} and "
                                         f"{AUDIT.trajectories} disagree at trajectory "
                                         f"{row.get('trajectory_id')!r}")
                    rows.append(compact(rec))
                w.write_lines(b"".join(lines).decode("utf-8"), raw.decode("utf-8"))
            for fh, (d, _) in zip(steps, shards, strict=True):
                if fh.readline():
                    raise UsageError(f"shard {d}: {AUDIT.steps} holds more steps than its "
                                     f"{AUDIT.trajectories} counts")
        finally:
            for fh in steps:
                fh.close()
        summaries = [s for _, s in shards]
        skipped = sorted((r for s in summaries for r in s.get("skipped_records") or []), key=key)
        warnings = sorted((r for s in summaries for r in s.get("warnings") or []), key=key)
        summary = build_summary(
            rows, opts, trajectories=sum(s["counts"]["trajectories"] for s in summaries),
            read=sum(s["counts"]["records_read"] for s in summaries), skipped=skipped,
            warnings=warnings, inputs=inputs,
            seconds=sum(float(s.get("seconds") or 0.0) for s in summaries))
        if "reference_counts" in first:
            summary["reference_counts"] = first["reference_counts"]
            summary["reference_skipped_records"] = first.get("reference_skipped_records", [])
        return w.finish(summary, plots=opts.plots)
