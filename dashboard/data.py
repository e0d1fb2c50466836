"""Cached loading for the pages: every reader is keyed on (path, size, mtime).

A file that grows (a live run) or is rewritten gets a new key, so the next rerun reads it again;
an unchanged file is served from ``st.cache_data``. Nothing here raises on bad content: a missing
or unreadable file gives an empty result and a note for the page.

    from dashboard import data
    m = data.metrics(run.metrics)        # Frame(frame, notes)
    s = data.steps(audit_dir)            # compact steps of an audit
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from audit.store.models import AuditSummary
from dashboard import readers
from dashboard.readers import Frame
from envace.core.layout import AUDIT

Sig = tuple[str, int, int]


def signature(path: str | os.PathLike[str]) -> Sig:
    """(path, size, mtime in ns); a missing file gives size -1 (and so its own cache key)."""
    try:
        s = os.stat(path)
    except OSError:
        return (str(path), -1, 0)
    return (str(path), s.st_size, s.st_mtime_ns)


@st.cache_data(max_entries=32, show_spinner=False)
def _metrics(path: str, size: int, mtime: int) -> Frame:
    return readers.metrics_frame(path)


@st.cache_data(max_entries=16, show_spinner="Reading audited steps…")
def _steps(path: str, size: int, mtime: int) -> Frame:
    return readers.steps_frame(path)


@st.cache_data(max_entries=32, show_spinner=False)
def _trajectories(path: str, size: int, mtime: int) -> Frame:
    return readers.trajectories_frame(path)


@st.cache_data(max_entries=64, show_spinner=False)
def _json(path: str, size: int, mtime: int) -> tuple[dict[str, Any] | None, str | None]:
    return readers.read_json(path)


@st.cache_data(max_entries=64, show_spinner="Recomputing an older audit summary…")
def _audit_summary(summary: Sig, steps: Sig) -> tuple[AuditSummary | None, str | None]:
    return readers.audit_summary(Path(summary[0]).parent)


@st.cache_data(max_entries=64, show_spinner=False)
def _jsonl(path: str, size: int, mtime: int) -> readers.JsonlData:
    return readers.read_jsonl(path)


@st.cache_data(max_entries=16, show_spinner=False)
def _line_offsets(path: str, size: int, mtime: int) -> list[int]:
    return readers.line_offsets(path)


@st.cache_data(max_entries=256, show_spinner=False)
def _lines_at(path: str, size: int, mtime: int, offsets: tuple[int, ...]) -> list[dict]:
    return readers.read_lines_at(path, list(offsets))


@st.cache_data(max_entries=16, show_spinner="Comparing audits…")
def _compare(a: Sig, b: Sig, sa: Sig, sb: Sig) -> dict[str, Any]:
    # lazy: loads numpy: only the page that needs it pays
    from audit.compare import compare_audits  # scipy; imported only when comparing

    return compare_audits(Path(a[0]).parent, Path(b[0]).parent)


def metrics(path: str | os.PathLike[str]) -> Frame:
    """``metrics.jsonl`` as a numeric frame (see :func:`readers.metrics_frame`)."""
    return _metrics(*signature(path))


def steps(audit_dir: str | os.PathLike[str]) -> Frame:
    """An audit's steps without texts (see :func:`readers.steps_frame`)."""
    return _steps(*signature(Path(audit_dir) / AUDIT.steps))


def trajectories(audit_dir: str | os.PathLike[str]) -> Frame:
    """An audit's ``trajectories.jsonl``; derived from the steps when it is absent."""
    p = Path(audit_dir) / AUDIT.trajectories
    if p.is_file():
        return _trajectories(*signature(p))
    s = steps(audit_dir)
    if s.frame.empty:
        return Frame(pd.DataFrame(), s.notes)
    return Frame(from_steps(s.frame), [*s.notes, f"{AUDIT.trajectories} is absent: trajectory "
                                                  f"rows were rebuilt from {AUDIT.steps}."])


def from_steps(frame: pd.DataFrame) -> pd.DataFrame:
    """Per-trajectory rows (steps, diverged, first divergence) from a steps frame."""
    g = frame.groupby("trajectory_id", observed=True, sort=False)
    out = g.agg(task_id=("task_id", "first"), steps=("step", "size"),
                diverged=("diverged", "sum")).reset_index()
    first = frame[frame["diverged"]].groupby("trajectory_id", observed=True)["step"].min()
    out["first_divergence"] = out["trajectory_id"].map(first)
    return out


def summary(audit_dir: str | os.PathLike[str]) -> tuple[AuditSummary | None, str | None]:
    """An audit's ``summary.json``: (data, None) or (None, why not); an older format is
    recomputed from ``steps.jsonl`` (see :func:`readers.audit_summary`)."""
    d = Path(audit_dir)
    return _audit_summary(signature(d / AUDIT.summary), signature(d / AUDIT.steps))


def json_file(path: str | os.PathLike[str]) -> tuple[dict[str, Any] | None, str | None]:
    return _json(*signature(path))


def jsonl(path: str | os.PathLike[str]) -> readers.JsonlData:
    """Any JSONL file, whole records (trajectory files of eval directories)."""
    return _jsonl(*signature(path))


def step_texts(audit_dir: str | os.PathLike[str], offsets: list[int]) -> list[dict[str, Any]]:
    """Full step records (responses, arguments, references) at these byte offsets."""
    return _lines_at(*signature(Path(audit_dir) / AUDIT.steps), tuple(int(o) for o in offsets))


def trajectory_record(path: str | os.PathLike[str], line: int) -> dict[str, Any] | None:
    """The JSON record on 1-based ``line`` of a trajectory file (None if there is none)."""
    sig = signature(path)
    offsets = _line_offsets(*sig)
    if not 1 <= line <= len(offsets):
        return None
    rec = _lines_at(*sig, (offsets[line - 1],))[0]
    return rec or None


def compare(dir_a: str | os.PathLike[str], dir_b: str | os.PathLike[str]) -> dict[str, Any]:
    """``audit.compare.compare_audits`` of two audit directories, cached on their files."""
    a, b = Path(dir_a), Path(dir_b)
    return _compare(signature(a / AUDIT.steps), signature(b / AUDIT.steps),
                    signature(a / AUDIT.summary), signature(b / AUDIT.summary))


def clear() -> None:
    """Drop every cached reading (the benchmark's cold start)."""
    st.cache_data.clear()


def audit_trend(audits: list[Any]) -> pd.DataFrame:
    """Divergence rate (with CI) of each audit of a training run, by training step: the
    figures ``metrics.jsonl`` logs as ``fidelity/divergence_rate`` for the same step."""
    rows = []
    for a in audits:
        s, _ = summary(a.path)
        if s is None or a.step is None or s.divergence_rate is None:
            continue
        lo, hi = (s.divergence_ci or [None, None])[:2]
        row = {"step": a.step, "divergence_rate": s.divergence_rate, "lo": lo, "hi": hi,
               "steps": s.scored_steps}
        for name, v in (s.scores or {}).items():
            row[f"score/{name}"] = v.mean
        rows.append(row)
    return pd.DataFrame(rows)
