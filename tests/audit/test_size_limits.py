"""Issue #39: size limits (docs/audit.md, "Size limits") are the same for every reader and
writer and cost one record. Before: an AgentDojo call with a 4 MB argument ran 54 s, took
4.4 GB and wrote a 395 MB steps line that `rescore` then refused."""

from __future__ import annotations

import json
import time
from unittest import mock

import pytest

from audit.pipeline import run_audit
from audit.rescore import rescore
from audit.scoring.settings import AuditOptions
from envace.core import schema
from envace.core.schema import MAX_CALL_BYTES, RecordTooLarge, TrajectoryWriter


def _traj(tid: str, args: dict, content: str = '{"result": 3}') -> dict:
    return {"schema": "envace.trajectory/1", "id": tid, "task_id": "t",
            "env": {"name": "bfcl", "state": {"involved_classes": ["MathAPI"]}},
            "source": "rehearsed", "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c0", "type": "function",
                     "function": {"name": "add", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "c0", "name": "add", "content": content,
                 "rehearsed": True}]}


@pytest.fixture(autouse=True)
def _no_plots():
    with mock.patch("audit.store.report.plot_all", return_value=[]):
        yield


def test_a_huge_argument_or_response_costs_its_record_before_any_replay(tmp_path):
    big = "x" * (4 * 1024 * 1024)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in [
        _traj("big-arg", {"a": big, "b": 1}), _traj("big-resp", {"a": 1, "b": 2}, big),
        _traj("ok", {"a": 1, "b": 2})]))
    t0 = time.monotonic()
    s = run_audit([str(src)], tmp_path / "out", AuditOptions(progress=False, plots=False))
    assert time.monotonic() - t0 < 30
    assert s["counts"]["trajectories"] == 1 and s["counts"]["skipped"] == 2
    reasons = [r["reason"] for r in s["skipped_records"]]
    assert all(f"{MAX_CALL_BYTES}-byte limit" in r for r in reasons), reasons
    steps = (tmp_path / "out" / "steps.jsonl").read_bytes()
    assert len(steps) < 10_000
    # and what was written reads back through rescore
    rescore(tmp_path / "out", tmp_path / "re", AuditOptions(progress=False, plots=False))


def test_a_line_past_the_line_limit_is_never_written_nor_read(tmp_path, monkeypatch):
    monkeypatch.setattr(schema, "MAX_LINE_BYTES", 4000)
    p = tmp_path / "t.jsonl"
    with TrajectoryWriter(p, mode="w") as w:
        with pytest.raises(RecordTooLarge):
            w.write(_traj("big", {"a": "y" * 5000, "b": 1}))
        w.write(_traj("small", {"a": 1, "b": 2}))
    items = list(schema.read_trajectories(p))
    assert [i.trajectory.id for i in items] == ["small"]


def test_the_dashboard_reader_applies_the_same_line_limit(tmp_path, monkeypatch):
    from dashboard import readers

    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 100)
    p = tmp_path / "steps.jsonl"
    p.write_text(json.dumps({"a": "x" * 200}) + "\n" + json.dumps({"a": 1}) + "\n")
    data = readers.read_jsonl(p)
    assert data.records == [{"a": 1}] and data.bad_lines == [(1, "line longer than 100 bytes")]
    assert readers.read_lines_at(p, [0]) == [{}]
