"""Aligning two trajectories' tool calls with ``difflib``, so an inserted or skipped call does
not misalign every later step.

Calls are compared as (tool, canonical arguments). Inside a replaced block, calls of the same
tool are paired (their arguments differ); the rest are *inserted* (only in this trajectory) or
*skipped* (only in the reference).

    rows = align_calls([("ls", {}), ("cd", {"folder": "a"})], [("cd", {"folder": "a"})])
    [(r.op, r.left, r.right) for r in rows]   # [('inserted', 0, None), ('same', 1, 0)]
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any

Call = tuple[str, Any]
OPS = ("same", "arguments differ", "inserted", "skipped")


@dataclass(frozen=True)
class Row:
    """One aligned row: indices into the left and right call lists (None on the empty side)."""

    op: str  # one of OPS
    left: int | None
    right: int | None


def _key(call: Call) -> str:
    tool, args = call
    return tool + json.dumps(args, sort_keys=True, ensure_ascii=False, default=str)


def _replace_block(left: list[Call], right: list[Call], i1: int, i2: int, j1: int,
                   j2: int) -> list[Row]:
    """Within a replaced block, pair calls of the same tool; the rest are inserted/skipped."""
    names_l = [c[0] for c in left[i1:i2]]
    names_r = [c[0] for c in right[j1:j2]]
    rows: list[Row] = []
    sm = difflib.SequenceMatcher(None, names_l, names_r, autojunk=False)
    for op, a1, a2, b1, b2 in sm.get_opcodes():
        if op == "equal":
            rows += [Row("arguments differ", i1 + a1 + k, j1 + b1 + k) for k in range(a2 - a1)]
        else:
            rows += [Row("inserted", i1 + i, None) for i in range(a1, a2)]
            rows += [Row("skipped", None, j1 + j) for j in range(b1, b2)]
    return rows


def align_calls(left: list[Call], right: list[Call]) -> list[Row]:
    """Align ``left`` (the trajectory shown) against ``right`` (the reference)."""
    sm = difflib.SequenceMatcher(None, [_key(c) for c in left], [_key(c) for c in right],
                                 autojunk=False)
    rows: list[Row] = []
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            rows += [Row("same", i1 + k, j1 + k) for k in range(i2 - i1)]
        elif op == "delete":
            rows += [Row("inserted", i, None) for i in range(i1, i2)]
        elif op == "insert":
            rows += [Row("skipped", None, j) for j in range(j1, j2)]
        else:
            rows += _replace_block(left, right, i1, i2, j1, j2)
    return rows


def summarize(rows: list[Row]) -> dict[str, int]:
    """How many rows of each kind."""
    return {op: sum(r.op == op for r in rows) for op in OPS}
