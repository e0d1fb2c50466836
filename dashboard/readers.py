"""Plain readers of run and audit files, tolerant of what a live or killed run leaves behind.

No Streamlit here (``dashboard/data.py`` wraps these in ``st.cache_data``), so the benchmark and
the tests call them directly. Every reader returns data plus *notes*: sentences a page shows the
user (a truncated last line, bad lines, a missing file), never an exception for bad content.
Text is handed on as it can be shown: a lone surrogate (valid JSON ``"\\ud800"``) becomes U+FFFD
(:func:`shown`); a row holding a number a frame cannot (an integer past int64) is left out and
named.

- :func:`read_jsonl` — records, bad lines, truncated last line.
- :func:`metrics_frame` — ``metrics.jsonl`` as a numeric DataFrame indexed by row; a row
  without a usable step is dropped and named, a non-finite value is a gap (one bad line costs
  one point, never the charts).
- :func:`steps_frame` — an audit's ``steps.jsonl`` without the response texts (compact, fast),
  with the byte offset of each line so :func:`read_lines_at` fetches texts on demand; every
  row read through ``audit.store.step_rows.StepStats`` (a line that is not a step row is named).
- :func:`audit_summary` — an audit's ``summary.json`` read through
  ``audit.store.models.AuditSummary`` (a malformed field is left out and named); one written before
  the current statistics (``envace.audit/1`` pooled real history steps with rehearsed ones) is
  recomputed from ``steps.jsonl`` so every page shows the figures a fresh audit would.
- :func:`trajectories_frame` — an audit's ``trajectories.jsonl``.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from audit.store.models import SUMMARY_VERSION, AuditSummary, read_summary_data
from audit.store.step_rows import STAT_FIELDS, StepStats, problem
from envace.core.layout import AUDIT, RUN
from envace.core.schema import MAX_LINE_BYTES

#: The range of an integer a frame holds (int64); a row with an integer outside it is skipped.
INT64 = (-(2**63), 2**63 - 1)
#: Where a JSON line may hold a lone surrogate: a ``\\uD800``-``\\uDFFF`` escape, or the
#: UTF-8-style bytes of one (``json.loads`` reads bytes with ``surrogatepass``).
_MAY_HOLD_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")
#: The most of one file a reader takes in (a steps file of a 462,500-step audit is ~200 MB).
MAX_FILE_BYTES = 4 << 30
STEP_FIELDS = ("trajectory_id", "task_id", "step", "depth", "tool", "diverged", "mutates_state",
               "actual_error", "rehearsed_error", "novelty", "unanswered", "source_rehearsed")
CATEGORICAL = ("trajectory_id", "task_id", "tool")


@dataclass
class JsonlData:
    """Records of a JSONL file and what was wrong with it."""

    records: list[dict[str, Any]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # byte offset of each record's line
    lines: list[int] = field(default_factory=list)  # 1-based line number of each record
    bad_lines: list[tuple[int, str]] = field(default_factory=list)  # (1-based line, reason)
    truncated: bool = False  # the last line has no newline and does not parse
    missing: bool = False
    not_regular: bool = False  # a FIFO, a device, a directory: never opened

    def notes(self, name: str) -> list[str]:
        """Sentences for the page: truncation and bad lines, with line numbers."""
        out = []
        if self.missing:
            out.append(f"{name} does not exist yet.")
        if self.not_regular:
            out.append(f"{name} is not a regular file (a FIFO, a device or a directory): not "
                       "read.")
        if self.truncated:
            out.append(f"{name}: the last line is truncated (a run still writing, or killed); "
                       f"showing the {len(self.records)} complete records before it.")
        bad = [b for b in self.bad_lines if not (self.truncated and b is self.bad_lines[-1])]
        if bad:
            shown = ", ".join(f"line {n} ({why})" for n, why in bad[:5])
            more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
            out.append(f"{name}: skipped {len(bad)} unreadable line(s): {shown}{more}.")
        return out


def shown_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD. Valid JSON may hold one
    (``"\\ud800"``), but no UTF-8 encoder takes it (pandas' hashing, Arrow, the browser), so a
    reader hands on what can be shown."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def shown(value: Any) -> Any:
    """A decoded JSON value with :func:`shown_text` applied to every string in it, keys too
    (``RecursionError`` for a value nested past the interpreter's limit)."""
    if isinstance(value, str):
        return shown_text(value)
    if isinstance(value, dict):
        return {shown_text(k) if isinstance(k, str) else k: shown(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shown(v) for v in value]
    return value


def _may_hold_surrogate(raw: bytes) -> bool:
    """Whether JSON text may decode to a lone surrogate (plain substring searches first: the
    pattern's scan is slower, and a file rarely holds any ``\\ud``)."""
    return ((b"\\ud" in raw or b"\\uD" in raw or b"\xed" in raw)
            and _MAY_HOLD_SURROGATE.search(raw) is not None)


def _loads_shown(raw: bytes, check: bool = True) -> Any:
    """``json.loads`` with lone surrogates replaced (:func:`shown`) where the line may hold one
    (``check`` False: the caller knows it cannot)."""
    rec = json.loads(raw)
    if check and _may_hold_surrogate(raw):
        rec = shown(rec)
    return rec


def _outside_int64(rec: dict[str, Any]) -> str | None:
    """The first top-level field of ``rec`` holding an integer a frame cannot (past int64)."""
    lo, hi = INT64
    for k, v in rec.items():
        if isinstance(v, int) and not isinstance(v, bool) and not lo <= v <= hi:
            return str(k)
    return None


def read_jsonl(path: str | os.PathLike[str], keep: tuple[str, ...] | None = None) -> JsonlData:
    """Every JSON object of a file, one a line; bad lines and a truncated tail are reported.

    ``keep`` limits each record to those of its keys (saves memory on big files).
    """
    out = JsonlData()
    try:
        if not is_regular(path):  # a FIFO would block the page, /dev/zero fill memory
            out.not_regular = True
            return out
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES)
    except FileNotFoundError:
        out.missing = True
        return out
    pos, lineno, n = 0, 0, len(data)
    may_hold = _may_hold_surrogate(data)  # one pass; then line by line where it may
    while pos < n:
        end = data.find(b"\n", pos)
        ended = end != -1
        stop = end if ended else n
        lineno += 1
        raw = data[pos:stop]
        start = pos
        pos = stop + 1
        if not raw.strip():
            continue
        if len(raw) > MAX_LINE_BYTES:  # the limit every reader and writer applies
            out.bad_lines.append((lineno, f"line longer than {MAX_LINE_BYTES} bytes"))
            continue
        try:
            rec = _loads_shown(raw, may_hold)
        except (ValueError, RecursionError) as exc:
            reason = f"invalid JSON: {shown_text(str(exc))}"[:120]
            out.bad_lines.append((lineno, reason))
            if not ended:
                out.truncated = True
            continue
        if not isinstance(rec, dict):
            out.bad_lines.append((lineno, f"not a JSON object ({type(rec).__name__})"))
            continue
        out.records.append({k: rec[k] for k in keep if k in rec} if keep else rec)
        out.offsets.append(start)
        out.lines.append(lineno)
    return out


def is_regular(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file (FileNotFoundError when it does not exist); a reader
    never opens anything else (a FIFO blocks, a device never ends)."""
    return stat.S_ISREG(os.stat(path).st_mode)


def read_json(path: str | os.PathLike[str]) -> tuple[dict[str, Any] | None, str | None]:
    """A whole JSON object file: (data, None) or (None, why it cannot be read)."""
    try:
        if not is_regular(path):
            return None, f"{Path(path).name} is not a regular file"
        data = _loads_shown(Path(path).read_bytes())
    except FileNotFoundError:
        return None, f"{Path(path).name} does not exist yet"
    except (OSError, ValueError, RecursionError) as exc:
        return None, f"{Path(path).name} cannot be read: {exc}"[:300]
    if not isinstance(data, dict):
        return None, f"{Path(path).name} is not a JSON object"
    return data, None


def audit_summary(audit_dir: str | os.PathLike[str]) -> tuple[AuditSummary | None, str | None]:
    """An audit's summary as ``audit.store.models.AuditSummary`` reads it: (summary, None) or
    (None, why not); a field of the wrong type is left out (``unusable_fields`` names it).
    Recomputed from ``steps.jsonl`` (``audit.rescore.summary_from_steps``, marked
    ``recomputed_from``) when it is older than the current summary format."""
    d = Path(audit_dir)
    raw, err = read_json(d / AUDIT.summary)
    if raw is None:
        return None, err
    summary, problems = read_summary_data(raw, AUDIT.summary)
    if summary is None:
        return None, problems[0]["reason"]
    if summary.schema_ != SUMMARY_VERSION and (d / AUDIT.steps).is_file():
        # lazy: loads numpy, rapidfuzz: only the page that needs it pays
        from audit.rescore import summary_from_steps

        try:
            return AuditSummary.model_validate(summary_from_steps(d)), None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            err = f"{AUDIT.summary} is of an older format and cannot be recomputed: {exc}"[:300]
    if problems:
        summary = AuditSummary.model_validate(
            {**summary.dump(), "unusable_fields": [p["reason"] for p in problems]})
    return summary, err


def read_text(path: str | os.PathLike[str], limit: int = 200_000) -> str | None:
    """A text file's start (None when absent, unreadable or not a regular file)."""
    try:
        if not is_regular(path):
            return None
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return None


@dataclass
class Frame:
    """A DataFrame and the notes its reading produced."""

    frame: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def _number(v: Any) -> float | None:
    """A finite number as float (bools count); None for anything else (inf and NaN too)."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        try:
            x = float(v)
        except OverflowError:
            return None
        return x if math.isfinite(x) else None
    return None


def _step(v: Any) -> int | None:
    """A row's step: a non-negative integer (``3`` or ``3.0``) a frame holds (int64), else
    None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if 0 <= v <= INT64[1] else None
    if isinstance(v, float) and math.isfinite(v) and v.is_integer() and 0 <= v < 2.0**63:
        return int(v)
    return None


def metrics_frame(path: str | os.PathLike[str]) -> Frame:
    """``metrics.jsonl`` → one row per record, every numeric key a column (``step`` first).

    Keys are kept as written (flat, '/'-grouped); non-numeric and non-finite values are dropped
    (a gap in a chart), so a new metric appears without code changes. A record whose ``step``
    is not a non-negative integer (``"two"``, ``null``, ``1.5``) is left out and named in the
    notes; a file where no record has a step is numbered by row.
    """
    data = read_jsonl(path)
    notes = data.notes(RUN.metrics)
    has_steps = any("step" in r for r in data.records)
    rows, bad = [], []
    for i, (r, line) in enumerate(zip(data.records, data.lines, strict=True)):
        row = {k: x for k, v in r.items() if k != "step" and (x := _number(v)) is not None}
        step = _step(r.get("step")) if has_steps else i
        if step is None:
            bad.append(f"line {line} (step {str(r.get('step'))[:20]!r})")
            continue
        rows.append({"step": step, **row})
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        notes.append(f"metrics.jsonl: skipped {len(bad)} record(s) without a usable step: "
                     f"{', '.join(bad[:5])}{more}.")
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["step"] = frame["step"].astype(int)
        frame = frame.sort_values("step", kind="stable").reset_index(drop=True)
        cols = ["step"] + sorted(c for c in frame.columns if c != "step")
        frame = frame[cols]
    return Frame(frame, notes)


def metric_groups(columns: list[str]) -> dict[str, list[str]]:
    """Group metric names by their prefix before '/' (a key without '/' is its own group).

    Numbered families inside a group get their own chart: ``fidelity/depth_0``,
    ``fidelity/depth_1``, ... form ``fidelity/depth``.
    """
    skip = {"step", "time", "wall_time", "timestamp"}
    groups: dict[str, list[str]] = {}
    for c in columns:
        if c in skip:
            continue
        head, _, rest = c.partition("/")
        m = _NUMBERED.match(rest)
        groups.setdefault(f"{head}/{m.group(1)}" if m else head, []).append(c)
    return groups


_NUMBERED = re.compile(r"^(\w+?)_\d+$")


def steps_frame(path: str | os.PathLike[str]) -> Frame:
    """An audit's ``steps.jsonl`` without texts: one row per call, ``score/<name>`` columns,
    ``offset`` (byte position of the line, for :func:`read_lines_at`). Every line is read as an
    ``audit.store.step_rows.StepStats``; one that is not a step row is left out and named."""
    data = read_jsonl(path, keep=STAT_FIELDS)
    rows, bad = [], []
    for rec, off, line in zip(data.records, data.offsets, data.lines, strict=True):
        try:
            s = StepStats.model_validate(rec)
        except ValidationError as exc:
            bad.append(f"line {line} ({problem(exc)})")
            continue
        # the audit's own rule (StepRow): depth counts answered rehearsed calls, never past
        # the call's index; and no integer a frame cannot hold
        if s.depth is not None and s.depth > s.step:
            bad.append(f"line {line} (depth {str(s.depth)[:20]} is past the step {s.step})")
            continue
        row = {k: getattr(s, k) for k in STEP_FIELDS}
        if (k := _outside_int64(row)) is not None:
            bad.append(f"line {line} ({k} is an integer past int64)")
            continue
        row["malformed"] = s.malformed is not None
        row["offset"] = off
        for name, v in s.scores.items():
            row[f"score/{name}"] = v
        rows.append(row)
    notes = data.notes(AUDIT.steps)
    if bad:
        notes.append(_skipped_note(AUDIT.steps, bad, "that are not step records"))
    frame = pd.DataFrame(rows, columns=None if rows else [*STEP_FIELDS, "malformed", "offset"])
    for c in CATEGORICAL:
        frame[c] = frame[c].astype(str).astype("category")
    for c in ("diverged", "mutates_state", "unanswered", "malformed", "actual_error"):
        frame[c] = frame[c].fillna(False).astype(bool)
    frame["step"] = frame["step"].astype(int)
    # depth among rehearsed steps; <NA> for real ones (and older files)
    frame["depth"] = pd.to_numeric(frame["depth"], errors="coerce").astype("Int64")
    return Frame(frame, notes)


def read_lines_at(path: str | os.PathLike[str], offsets: list[int]) -> list[dict[str, Any]]:
    """The JSON records starting at these byte offsets (a bad one, a negative offset or a file
    that is gone becomes ``{}``)."""
    out: list[dict[str, Any]] = []
    try:
        regular = is_regular(path)
    except OSError:
        regular = False
    if not regular:
        return [{} for _ in offsets]
    with open(path, "rb") as fh:
        for off in offsets:
            if isinstance(off, bool) or not isinstance(off, int) or off < 0:
                out.append({})
                continue
            fh.seek(off)
            try:
                line = fh.readline(MAX_LINE_BYTES + 1)
                rec = _loads_shown(line) if len(line) <= MAX_LINE_BYTES else {}
            except (ValueError, RecursionError):
                rec = {}
            out.append(rec if isinstance(rec, dict) else {})
    return out


def trajectories_frame(path: str | os.PathLike[str]) -> Frame:
    """An audit's ``trajectories.jsonl`` (one row per audited trajectory); a row holding an
    integer a frame cannot (past int64) is left out and named."""
    data = read_jsonl(path)
    rows, bad = [], []
    for rec, line in zip(data.records, data.lines, strict=True):
        if (k := _outside_int64(rec)) is not None:
            bad.append(f"line {line} ({k} is an integer past int64)")
            continue
        rows.append(rec)
    notes = data.notes(AUDIT.trajectories)
    if bad:
        notes.append(_skipped_note(AUDIT.trajectories, bad, "a table cannot hold"))
    return Frame(pd.DataFrame(rows), notes)


def _skipped_note(name: str, bad: list[str], what: str) -> str:
    """The note naming the first five lines of ``name`` a frame left out, and how many more."""
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    return f"{name}: skipped {len(bad)} line(s) {what}: {', '.join(bad[:5])}{more}."


def line_offsets(path: str | os.PathLike[str]) -> list[int]:
    """Byte offset of the start of every line (for random access to a trajectory file)."""
    offsets = [0]
    try:
        if not is_regular(path):
            return []
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES)
    except OSError:  # gone or unreadable (since it was listed)
        return []
    pos = data.find(b"\n")
    while pos != -1:
        offsets.append(pos + 1)
        pos = data.find(b"\n", pos + 1)
    if offsets[-1] >= len(data):
        offsets.pop()
    return offsets


def read_line(path: str | os.PathLike[str], offset: int) -> str:
    """The text of the line at a byte offset."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.readline().decode("utf-8", errors="replace")
