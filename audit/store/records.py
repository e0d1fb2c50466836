"""Reading a stored audit back (``rescore``, ``compare``, the dashboard): checked, line by line.

    steps = read_steps(audit_dir)       # StepsRead: records, skipped (file, line, reason), raw
    summary, problems = read_summary(audit_dir)

A line of ``steps.jsonl`` is used only when it is a UTF-8 JSON object that is a step row
(``audit.store.step_rows.StepRow``, :func:`step_problem`); any other line is reported with its file,
line and a one-line reason and its bytes are kept (``StepsRead.bad``) so that a rewrite can
keep them verbatim (``steps.unreadable.jsonl``). ``summary.json`` is read through
``audit.store.models.AuditSummary`` field by field: a field of the wrong type is dropped and named,
never trusted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit.store.models import read_summary_data, skipped_row
from audit.store.step_rows import step_problem
from envace.core.errors import UsageError
from envace.core.infile import read_small_bytes
from envace.core.layout import AUDIT
from envace.core.schema import MAX_LINE_BYTES, bounded_lines

#: the largest ``summary.json`` read (a regular file only: ``envace.core.infile``)
MAX_SUMMARY_BYTES = 256 * 1024 * 1024

__all__ = ["StepsRead", "read_steps", "read_summary", "step_problem"]


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


def read_steps(audit_dir: str | Path) -> StepsRead:
    """Every usable record of ``audit_dir/steps.jsonl``; every other line reported and kept."""
    path = Path(audit_dir) / AUDIT.steps
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
    out.skipped.append(skipped_row(out.path, line, why))
    out.bad.append(raw if raw.endswith(b"\n") else raw + b"\n")


def read_summary(audit_dir: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The usable fields of ``audit_dir/summary.json`` (``audit.store.models.AuditSummary``, as
    written) and a skipped-record entry per problem."""
    path = Path(audit_dir) / AUDIT.summary
    where = str(path)
    if not path.exists():
        return {}, [skipped_row(where, None, "missing")]
    try:  # a regular file within its cap: a FIFO or a device is refused, never waited on
        data = json.loads(read_small_bytes(path, MAX_SUMMARY_BYTES, AUDIT.summary).decode("utf-8"))
    except UsageError as exc:
        return {}, [skipped_row(where, None, str(exc)[:300])]
    except UnicodeDecodeError as exc:
        return {}, [skipped_row(where, None, f"not UTF-8 at byte {exc.start}")]
    except (ValueError, RecursionError) as exc:
        return {}, [skipped_row(where, None, f"invalid JSON: {exc}"[:300])]
    except OSError as exc:
        return {}, [skipped_row(where, None, f"cannot read: {exc.strerror}")]
    try:
        summary, problems = read_summary_data(data, where)
    except RecursionError:
        return {}, [skipped_row(where, None, "nested too deeply")]
    if summary is None:
        return {}, problems
    out = {k: v for k, v in summary.dump().items() if v is not None}
    return out, problems
