"""Reading a stored audit back (``rescore``, ``compare``, the dashboard): checked, line by line.

    steps = read_steps(audit_dir)       # StepsRead: records, skipped (file, line, reason), raw
    summary, problems = read_summary(audit_dir)

A line of ``steps.jsonl`` is used only when it is UTF-8 JSON object with the fields and types
the statistics need (:func:`step_problem`); any other line is reported with its file, line and a
one-line reason and its bytes are kept (``StepsRead.bad``) so that a rewrite can keep them
verbatim (``steps.unreadable.jsonl``). ``summary.json`` is used field by field: a field of the
wrong type is dropped and named, never trusted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.core.schema import MAX_LINE_BYTES, bounded_lines


@dataclass
class StepsRead:
    """The usable step records of a ``steps.jsonl``, and what could not be used."""

    path: str
    records: list[dict[str, Any]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # line number of each record
    skipped: list[dict[str, Any]] = field(default_factory=list)
    bad: list[bytes] = field(default_factory=list)  # each skipped line, verbatim
    nonblank: int = 0

    @property
    def unusable(self) -> bool:
        """Lines there are, and none of them is usable."""
        return self.nonblank > 0 and not self.records


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _typed(rec: dict[str, Any], key: str, types: tuple[type, ...], optional: bool) -> str | None:
    if key not in rec:
        return None if optional else f"missing field {key!r}"
    v = rec[key]
    if v is None and optional:
        return None
    if isinstance(v, bool) and bool not in types:
        return f"{key} is a bool"
    if not isinstance(v, types):
        return f"{key} is {type(v).__name__}, expected {'/'.join(t.__name__ for t in types)}"
    return None


def _scores_problem(scores: Any, where: str) -> str | None:
    if not isinstance(scores, dict):
        return f"{where} is {type(scores).__name__}, expected an object"
    for k, v in scores.items():
        if not _number(v):
            return f"{where}.{k} is {v!r:.40}, expected a finite number"
    return None


def step_problem(rec: Any) -> str | None:
    """Why a decoded ``steps.jsonl`` line cannot be used, or None."""
    if not isinstance(rec, dict):
        return f"a step record must be a JSON object, got {type(rec).__name__}"
    checks = [("trajectory_id", (str,), False), ("task_id", (str,), False),
              ("step", (int,), False), ("tool", (str,), False), ("diverged", (bool,), False),
              ("actual", (str,), False), ("rehearsed", (str,), True), ("unanswered", (bool,), True),
              ("source_rehearsed", (bool,), True), ("actual_error", (bool,), True),
              ("rehearsed_error", (bool,), True), ("mutates_state", (bool,), True),
              ("malformed", (str,), True), ("depth", (int,), True), ("novelty", (int, float), True)]
    for key, types, optional in checks:
        why = _typed(rec, key, types, optional)
        if why:
            return why
    if rec["step"] < 0:
        return "step is negative"
    if rec.get("novelty") is not None and not math.isfinite(rec["novelty"]):
        return "novelty is not finite"
    why = _scores_problem(rec.get("scores", {}), "scores")
    if why:
        return why
    refs = rec.get("references")
    if refs is not None:
        if not isinstance(refs, dict):
            return "references is not an object"
        for name, r in refs.items():
            if not isinstance(r, dict) or not isinstance(r.get("response"), str):
                return f"references.{name} has no response text"
            why = _scores_problem(r.get("scores"), f"references.{name}.scores")
            if why:
                return why
    return None


def read_steps(audit_dir: str | Path) -> StepsRead:
    """Every usable record of ``audit_dir/steps.jsonl``; every other line reported and kept."""
    path = Path(audit_dir) / "steps.jsonl"
    out = StepsRead(str(path))
    with open(path, "rb") as fh:
        for n, raw, too_long in bounded_lines(fh, keep_long=True):
            if too_long:
                _skip(out, n, raw, f"line longer than {MAX_LINE_BYTES} bytes")
                continue
            if not raw.strip():
                continue
            out.nonblank += 1
            why = None
            try:
                rec = json.loads(raw.decode("utf-8"))
                why = step_problem(rec)
            except UnicodeDecodeError as exc:
                why = f"not UTF-8 at byte {exc.start}"
            except json.JSONDecodeError as exc:
                why = f"invalid JSON: {exc.msg} at column {exc.colno}"
            except ValueError as exc:  # e.g. an integer longer than Python converts
                why = f"invalid JSON: {exc}"
            except RecursionError:
                why = "invalid JSON: nested too deeply"
            if why is None:
                out.records.append(rec)
                out.lines.append(n)
            else:
                if not raw.endswith(b"\n"):
                    why = f"truncated last line (no newline): {why}"
                _skip(out, n, raw, why)
    return out


def _skip(out: StepsRead, line: int, raw: bytes, why: str) -> None:
    out.skipped.append({"file": out.path, "line": line, "reason": why})
    out.bad.append(raw if raw.endswith(b"\n") else raw + b"\n")


#: summary.json fields other commands use, and the type each must have.
_SUMMARY_FIELDS: dict[str, tuple[type, ...]] = {
    "schema": (str,), "inputs": (list,), "scorers": (list,), "verdict": (dict,),
    "counts": (dict,), "skipped_records": (list,), "warnings": (list,),
    "reference_file": (str,), "reference_skipped_records": (list,), "audited_model": (str,),
    "probe": (str,), "rescored_from": (str,),
}


def _record_list_ok(items: list, keys: tuple[str, ...]) -> bool:
    return all(isinstance(x, dict) and all(k in x for k in keys) for x in items)


def read_summary(audit_dir: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The usable fields of ``audit_dir/summary.json`` and a skipped-record entry per problem."""
    path = Path(audit_dir) / "summary.json"
    where = str(path)
    if not path.exists():
        return {}, [{"file": where, "line": None, "reason": "missing"}]
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        return {}, [{"file": where, "line": None, "reason": f"not UTF-8 at byte {exc.start}"}]
    except (ValueError, RecursionError) as exc:
        return {}, [{"file": where, "line": None, "reason": f"invalid JSON: {exc}"[:300]}]
    if not isinstance(data, dict):
        return {}, [{"file": where, "line": None, "reason": "not a JSON object"}]
    out: dict[str, Any] = {}
    problems = []
    for key, types in _SUMMARY_FIELDS.items():
        if key not in data or data[key] is None:
            continue
        v = data[key]
        ok = isinstance(v, types)
        if ok and key in ("inputs", "scorers"):
            ok = all(isinstance(x, str) for x in v)
        elif ok and key == "counts":
            ok = all(isinstance(x, int) and not isinstance(x, bool) for x in v.values())
        elif ok and key == "verdict":
            ok = isinstance(v.get("scorer"), str) and _number(v.get("threshold"))
        elif ok and key in ("skipped_records", "reference_skipped_records"):
            ok = _record_list_ok(v, ("file", "line", "reason"))
        elif ok and key == "warnings":
            ok = _record_list_ok(v, ("file", "line", "trajectory_id", "message"))
        if ok:
            out[key] = v
        else:
            problems.append({"file": where, "line": None,
                             "reason": f"field {key!r} is malformed; not used"})
    return out, problems
