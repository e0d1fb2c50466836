"""Deterministic shards of an audit's input, so that machines can share one audit.

    envace-audit replay in.jsonl --shard 2/8 --out shards/2     # on eight machines, I = 0..7
    envace-audit merge shards/* --out audit                    # the audit one run gives

Shard ``I/N`` (``0 <= I < N``) audits the trajectories whose id hashes to ``I``
(:func:`shard_of`: BLAKE2b of the id modulo ``N``, the same on every machine and Python). Every
shard reads the whole input (it must see every id to know its own); a line that cannot be read
or validated has no id and is reported by shard 0 alone, so each record is counted by exactly
one shard. Two records with one id always fall into the same shard, so the first is audited and
the second skipped exactly as in a single run.

A shard's ``summary.json`` is an audit of its part and carries a ``shard`` block
(:func:`shard_block`): its index and count, the inputs' sizes and BLAKE2b digests and every
setting that changes a step row or a figure. ``audit.merge`` refuses shards whose blocks
disagree, a missing or a repeated index, a row whose id is another shard's (:func:`shard_of`)
or given twice, and counts that are not what the shard's files hold, and recomputes every
statistic from the merged step rows, so the merged intervals are a single run's whatever the
split (the split is by trajectory, not by resampling cluster: no figure is combined from
per-shard figures).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

from envace.core.errors import UsageError

__all__ = ["MAX_SHARDS", "UNREADABLE_OWNER", "file_digest", "parse_shard", "shard_block",
           "shard_of"]

UNREADABLE_OWNER = 0  #: the shard that reports lines without a readable id
#: the most shards an audit may be split into (``--shard I/N``, ``N <= MAX_SHARDS``): far more
#: machines than any audit uses, and small enough that a merge can name what is missing
MAX_SHARDS = 10**6
SHARD_SCHEMA = "envace.audit-shard/1"


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` as ``(I, N)``; ``ValueError`` unless ``0 <= I < N <= MAX_SHARDS``."""
    left, sep, right = str(text).partition("/")
    try:
        index, count = int(left), int(right)
    except ValueError:
        raise ValueError(f"--shard takes I/N (e.g. 0/4), got {text!r}") from None
    if not sep or count < 1 or not 0 <= index < count:
        raise ValueError(f"--shard I/N needs 0 <= I < N, got {text!r}")
    if count > MAX_SHARDS:
        raise ValueError(f"--shard I/N: N is at most {MAX_SHARDS}, got {text!r}")
    return index, count


def shard_of(trajectory_id: str, count: int) -> int:
    """The shard (``0..count-1``) of a trajectory id: BLAKE2b of its UTF-8 bytes mod ``count``."""
    digest = hashlib.blake2b(str(trajectory_id).encode("utf-8", "surrogatepass"),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def file_digest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Size and BLAKE2b digest of a file (``UsageError`` when it cannot be read)."""
    h = hashlib.blake2b(digest_size=16)
    size = 0
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    return {"file": str(path), "bytes": size, "blake2b": h.hexdigest()}


def check_inputs(inputs: Sequence[str]) -> None:
    """A sharded audit orders merged records by (input, line): an input named twice would
    make that order ambiguous, so it is refused (``UsageError``)."""
    seen = set()
    for p in inputs:
        if str(p) in seen:
            raise UsageError(f"--shard: input {p} is named twice")
        seen.add(str(p))


def shard_block(index: int, count: int, inputs: Sequence[str], opts: Any) -> dict[str, Any]:
    """The ``shard`` block of a shard's ``summary.json``: which shard, of what input, audited
    how (every setting that changes a step row or a statistic)."""
    return {
        "schema": SHARD_SCHEMA,
        "index": index,
        "count": count,
        "inputs": [file_digest(p) for p in inputs],
        "settings": {
            "scorers": list(opts.scorers),
            "verdict_scorer": opts.verdict_scorer,
            "verdict_threshold": opts.verdict_threshold,
            "cluster_by": opts.cluster_by,
            "reference": None if opts.reference is None else file_digest(opts.reference),
            "override": opts.override,
            "plots": opts.plots,
            "call_timeout_s": opts.call_timeout_s,
            "call_memory_mb": opts.call_memory_mb,
        },
    }
