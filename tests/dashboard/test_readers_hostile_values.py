"""The dashboard's readers on values an audit or a run may hold but a frame cannot (issue 39, the
hostile tester's dashboard cases): a lone surrogate in a text (valid JSON, ``"\\ud800"``) is shown
as U+FFFD, so no frame, table or page fails to encode it; a number out of the range the frame
holds (an integer past int64, a step of 10**20) costs its one row, named in the notes, never the
frame. Fuzzed: any JSON value in any field of a step row, a metrics row or a trajectory row gives
a frame (the row kept or named as skipped) whose every text encodes as UTF-8."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streamlit.testing.v1 import AppTest

from dashboard import readers

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "dashboard" / "app.py")
SUR_ID = "sur-\ud800-id"
SHOWN_ID = "sur-\ufffd-id"


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def sur_root(tmp_path_factory) -> Path:
    """A dashboard root with one audit ("sur") of two BFCL dev trajectories, the first with a
    lone surrogate in its id, made by the real commands (the audit replays it, exit 0)."""
    root = tmp_path_factory.mktemp("sur_root")
    dev = root / "dev.jsonl"
    r = _run([sys.executable, "-m", "envace.cli", "data", "export-real", "--split", "dev",
              "--out", str(dev)])
    assert r.returncode == 0, r.stderr
    first, second = dev.read_text().splitlines()[:2]
    rec = json.loads(first)
    rec["id"] = SUR_ID
    inp = root / "sur.jsonl"
    inp.write_text(json.dumps(rec) + "\n" + second + "\n")  # "\ud800" escaped: valid JSON
    assert "\\ud800" in inp.read_text()
    dev.unlink()
    r = _run([sys.executable, "-m", "audit.cli", "--quiet", "replay", str(inp), "--out",
              str(root / "sur")])
    assert r.returncode == 0, r.stderr
    return root


def _encodes(frame: pd.DataFrame) -> None:
    """Every text of the frame (cells, categories, column names) encodes as UTF-8."""
    for c in frame.columns:
        str(c).encode("utf-8")
        for v in frame[c].astype(object).tolist():
            if isinstance(v, str):
                v.encode("utf-8")


def test_a_surrogate_id_reads_as_a_replacement_character(sur_root):
    audit = sur_root / "sur"
    steps = readers.steps_frame(audit / "steps.jsonl")
    trajs = readers.trajectories_frame(audit / "trajectories.jsonl")
    assert SHOWN_ID in steps.frame["trajectory_id"].astype(str).tolist()
    assert SHOWN_ID in trajs.frame["trajectory_id"].tolist()
    assert len(trajs.frame) == 2 and not steps.notes and not trajs.notes
    _encodes(steps.frame)
    _encodes(trajs.frame)
    hit = steps.frame[steps.frame["trajectory_id"] == SHOWN_ID]
    rec = readers.read_lines_at(audit / "steps.jsonl", hit["offset"].tolist()[:1])[0]
    assert rec["trajectory_id"] == SHOWN_ID
    got = readers.read_jsonl(audit / "trajectories.jsonl")
    assert got.records[0]["trajectory_id"] == SHOWN_ID
    path = sur_root / "s.json"
    path.write_text('{"\\ud800k": ["\\udfff"]}')
    assert readers.read_json(path) == ({"\ufffdk": ["\ufffd"]}, None)


def test_the_trajectories_page_shows_a_surrogate_id(sur_root, monkeypatch):
    """The tester's page: "Could not show the trajectories: UnicodeEncodeError" for the whole
    audit. Now the table lists it and the trajectory opens, its conversation read too."""
    monkeypatch.setenv("ENVACE_DASHBOARD_ROOT", str(sur_root))
    for page in ("runs", "fidelity", "trajectories"):
        at = AppTest.from_file(APP, default_timeout=120)
        at.query_params.update({"run": "sur", "traj": SHOWN_ID})
        at.run()
        if page != "runs":
            at.switch_page(f"views/{page}.py").run()
        assert not at.exception, (page, [e.value for e in at.exception])
        assert not at.error, (page, [e.value for e in at.error])
    table = at.dataframe[0].value
    assert SHOWN_ID in table["trajectory_id"].astype(str).tolist()
    assert at.selectbox(key="tr_traj").value == SHOWN_ID
    assert not at.warning, [w.value for w in at.warning]  # the conversation's id matched
    assert len(at.get("text")) > 0 or len(at.markdown) > 3


def _step_row(**kw: object) -> dict:
    row = {"trajectory_id": "t1", "task_id": "x", "step": 1, "tool": "ls", "diverged": False,
           "scores": {"exact": 1.0}, "depth": 0, "novelty": 0.5}
    row.update(kw)
    return row


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("field,value", [("depth", 10 ** 20), ("depth", 2 ** 63),
                                         ("novelty", 10 ** 20), ("novelty", 10 ** 400),
                                         ("scores", {"exact": 10 ** 400})])
def test_a_step_number_past_the_frame_costs_its_row(tmp_path, field, value):
    p = _write(tmp_path / "steps.jsonl", [_step_row(), _step_row(**{field: value}),
                                          _step_row(step=2)])
    got = readers.steps_frame(p)
    assert got.frame["step"].tolist() == [1, 2], got.frame
    assert any("line 2" in n for n in got.notes), got.notes


@pytest.mark.parametrize("step", [10 ** 20, 2 ** 63, 1e300, -1])
def test_a_metrics_step_past_int64_costs_its_row(tmp_path, step):
    p = _write(tmp_path / "metrics.jsonl", [{"step": step, "loss": 1}, {"step": 1, "loss": 2}])
    got = readers.metrics_frame(p)
    assert got.frame["step"].tolist() == [1] and got.frame["loss"].tolist() == [2.0]
    assert str(got.frame["step"].dtype) == "int64"
    assert any("line 1" in n for n in got.notes), got.notes


def test_the_largest_int64_step_is_kept(tmp_path):
    p = _write(tmp_path / "metrics.jsonl", [{"step": 2 ** 63 - 1, "loss": 1}])
    assert readers.metrics_frame(p).frame["step"].tolist() == [2 ** 63 - 1]


TEXT = st.text(alphabet=st.sampled_from(["a", "é", "\ud800", "\udfff", "\U0001f600", " "]),
               max_size=6)
NUMBER = (st.integers() | st.sampled_from([2 ** 63 - 1, 2 ** 63, -2 ** 63, -2 ** 63 - 1,
                                           10 ** 20, 10 ** 400])
          | st.floats(allow_nan=True, allow_infinity=True))
JSON = st.recursive(st.none() | st.booleans() | NUMBER | TEXT,
                    lambda kids: st.lists(kids, max_size=3)
                    | st.dictionaries(TEXT, kids, max_size=3), max_leaves=8)
FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
STEP_KEYS = ["trajectory_id", "task_id", "step", "depth", "tool", "diverged", "mutates_state",
             "actual_error", "rehearsed_error", "novelty", "unanswered", "source_rehearsed",
             "scores", "malformed", "history", "state_change"]


def _kept_or_named(got: readers.Frame, n_kept: int, line: int) -> None:
    assert len(got.frame) == n_kept + 1 or any(f"line {line}" in n for n in got.notes), got.notes
    _encodes(got.frame)
    for n in got.notes:
        n.encode("utf-8")


@FUZZ
@given(key=st.sampled_from(STEP_KEYS) | TEXT, value=JSON)
def test_any_value_in_a_step_row_costs_at_most_its_row(tmp_path_factory, key, value):
    p = _write(tmp_path_factory.mktemp("f") / "steps.jsonl",
               [_step_row(), {**_step_row(step=2), key: value}, _step_row(step=3)])
    got = readers.steps_frame(p)
    assert {1, 3} <= set(got.frame["step"].tolist())
    _kept_or_named(got, 2, 2)


@FUZZ
@given(key=st.sampled_from(["step", "loss", "reward/mean"]) | TEXT, value=JSON)
def test_any_value_in_a_metrics_row_costs_at_most_its_row(tmp_path_factory, key, value):
    p = _write(tmp_path_factory.mktemp("f") / "metrics.jsonl",
               [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 2.0, key: value},
                {"step": 2, "loss": 3.0}])
    got = readers.metrics_frame(p)
    assert {0, 2} <= set(got.frame["step"].tolist())
    _kept_or_named(got, 2, 2)


@FUZZ
@given(key=st.sampled_from(["trajectory_id", "steps", "reward", "meta"]) | TEXT, value=JSON)
def test_any_value_in_a_trajectory_row_keeps_the_frame(tmp_path_factory, key, value):
    p = _write(tmp_path_factory.mktemp("f") / "trajectories.jsonl",
               [{"trajectory_id": "a", "steps": 1}, {"trajectory_id": "b", "steps": 2, key: value},
                {"trajectory_id": "c", "steps": 3}])
    got = readers.trajectories_frame(p)
    _kept_or_named(got, 2, 2)
    assert len(got.frame) >= 2


def test_random_access_survives_a_gone_file_and_bad_offsets(tmp_path):
    """Tester round 5: a negative offset raised OSError, a missing file FileNotFoundError."""
    from dashboard.readers import line_offsets, read_lines_at

    f = tmp_path / "t.jsonl"
    f.write_text('{"a": 1}\n{"b": 2}\n')
    assert line_offsets(f) == [0, 9]
    assert read_lines_at(f, [9, -1, 0]) == [{"b": 2}, {}, {"a": 1}]
    assert line_offsets(tmp_path / "gone.jsonl") == []
    assert read_lines_at(tmp_path / "gone.jsonl", [0]) == [{}]
