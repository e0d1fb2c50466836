"""The dashboard's pure parts: readers, run discovery and status, the JSON diff, step alignment,
the launcher, and the rule that the dashboard never imports torch or the trainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dashboard import align, jsondiff, launch, readers, runs

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- readers


def test_read_jsonl_reports_bad_lines_and_a_truncated_tail(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 0}\n\nnot json\n[1]\n{"step": 1}\n{"step": 2, "lo')
    got = readers.read_jsonl(p)
    assert [r["step"] for r in got.records] == [0, 1]
    assert got.truncated
    assert [n for n, _ in got.bad_lines] == [3, 4, 6]
    notes = " ".join(got.notes("m.jsonl"))
    assert "last line is truncated" in notes and "2 complete records" in notes
    assert "skipped 2 unreadable line(s): line 3" in notes
    assert readers.read_jsonl(tmp_path / "absent.jsonl").missing


def test_metrics_frame_keeps_numeric_keys_sorted_by_step(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in [
        {"step": 2, "loss": 0.5, "reward/mean": 1, "tag": "x", "flag": True},
        {"step": 1, "loss": 0.7, "new/key": 3}]) + "\n")
    f = readers.metrics_frame(p).frame
    assert list(f["step"]) == [1, 2]
    assert set(f.columns) == {"step", "loss", "reward/mean", "new/key", "flag"}
    assert readers.metric_groups(list(f.columns)) == {
        "flag": ["flag"], "loss": ["loss"], "new": ["new/key"], "reward": ["reward/mean"]}


def test_steps_frame_offsets_fetch_the_full_records(tmp_path):
    recs = [{"trajectory_id": "t", "task_id": "k", "step": i, "tool": "ls", "diverged": i == 1,
             "scores": {"exact": float(i != 1)}, "rehearsed": f"r{i}", "actual": f"a{i}"}
            for i in range(3)]
    p = tmp_path / "steps.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    f = readers.steps_frame(p).frame
    assert list(f["score/exact"]) == [1.0, 0.0, 1.0] and list(f["diverged"]) == [0, 1, 0]
    assert "rehearsed" not in f
    back = readers.read_lines_at(p, f["offset"].tolist())
    assert [r["actual"] for r in back] == ["a0", "a1", "a2"]
    assert readers.steps_frame(tmp_path / "none.jsonl").frame.empty


def test_line_offsets_and_read_line(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("a\nbb\n\nccc")
    offs = readers.line_offsets(p)
    assert [readers.read_line(p, o).rstrip("\n") for o in offs] == ["a", "bb", "", "ccc"]


# ---------------------------------------------------------------- runs


def _audit(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "summary.json").write_text("{}")
    (d / "steps.jsonl").write_text("")
    return d


def test_discover_status_and_audits(tmp_path):
    fin = tmp_path / "fin"
    _audit(fin / "audit" / "step_10")
    _audit(fin / "audit" / "step_2")
    (fin / "report.md").write_text("done")
    live = tmp_path / "live"
    live.mkdir()
    (live / "metrics.jsonl").write_text("{}\n")
    dead = tmp_path / "dead"
    dead.mkdir()
    (dead / "metrics.jsonl").write_text("{}\n")
    old = time.time() - 600
    os.utime(dead / "metrics.jsonl", (old, old))
    _audit(tmp_path / "group" / "plain")
    (tmp_path / "empty").mkdir()
    ev = tmp_path / "eval-dev"
    _audit(ev / "audit")
    (ev / "summary.json").write_text("{}")
    (ev / "trajectories.jsonl").write_text("")
    found = {r.name: r for r in runs.discover(tmp_path)}
    assert set(found) == {"fin", "live", "dead", "group/plain", "empty", "eval-dev"}
    assert found["eval-dev"].kind == "eval" and found["eval-dev"].evals == [ev.resolve()]
    assert [a.path for a in found["eval-dev"].audits] == [(ev / "audit").resolve()]
    assert [a.step for a in found["fin"].audits] == [2, 10]  # numeric order, not text
    assert found["fin"].status == "finished" and found["live"].status == "running"
    assert found["dead"].status == "died" and found["group/plain"].kind == "audit"
    (dead / "RUNNING").write_text("")  # a marker left behind by a crash: not a sign of life
    os.utime(dead / "RUNNING", (old, old))
    assert runs.run_status(dead) == "died"
    assert [r.name for r in runs.discover(fin / "audit" / "step_2")] == ["."]
    assert runs.discover(tmp_path / "missing") == []


def test_resolve_inside_refuses_escapes(tmp_path):
    (tmp_path / "a").mkdir()
    assert runs.resolve_inside(tmp_path, "a") == (tmp_path / "a").resolve()
    for bad in ("..", "../x", "/etc", "a/../../x"):
        with pytest.raises(runs.OutsideRoot):
            runs.resolve_inside(tmp_path, bad)
    link = tmp_path / "link"
    link.symlink_to("/etc")
    with pytest.raises(runs.OutsideRoot):
        runs.resolve_inside(tmp_path, "link")


# ---------------------------------------------------------------- JSON diff and alignment


def test_json_diff_marks_only_the_differing_leaves():
    d = jsondiff.json_diff('{"a": 1, "b": [1, 2, 3], "c": {"x": "<b>"}, "e": 5}',
                           '{"a": 2, "b": [1, 3], "c": {"x": "<b>"}, "f": 1.0}')
    assert d.structured
    assert {(x.path, x.kind) for x in d.leaves} == {
        ("$.a", "changed"), ("$.b[1]", "extra"), ("$.e", "extra"), ("$.f", "missing")}
    assert "&lt;b&gt;" in d.left_html and "<b>" not in d.left_html  # escaped
    assert d.left_html.count(jsondiff.CHANGED) == 1 and d.right_html.count(jsondiff.CHANGED) == 1
    assert jsondiff.json_diff('{"a": 1}', '{"a": 1.0}').equal
    assert not jsondiff.json_diff('{"a": true}', '{"a": 1}').equal
    assert jsondiff.json_diff("[]", "{}").leaves[0].path == "$"


def test_json_diff_falls_back_to_words_for_text():
    d = jsondiff.json_diff("hello world foo", "hello brave world")
    assert not d.structured
    assert {x.kind for x in d.leaves} == {"missing", "extra"}
    assert jsondiff.json_diff(None, "").equal


def test_align_calls_inserted_skipped_and_changed():
    left = [("ls", {}), ("cd", {"folder": "a"}), ("cat", {"f": 1}), ("pwd", {})]
    right = [("cd", {"folder": "a"}), ("cat", {"f": 2}), ("rm", {}), ("pwd", {})]
    rows = align.align_calls(left, right)
    assert [(r.op, r.left, r.right) for r in rows] == [
        ("inserted", 0, None), ("same", 1, 0), ("arguments differ", 2, 1),
        ("skipped", None, 2), ("same", 3, 3)]
    assert align.summarize(rows) == {"same": 2, "arguments differ": 1, "inserted": 1,
                                     "skipped": 1}


# ---------------------------------------------------------------- launcher and imports


def test_launch_command_and_bad_root(tmp_path, capsys):
    cmd = launch.command(str(tmp_path), port=8765)
    assert cmd[:4] == [sys.executable, "-m", "streamlit", "run"]
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--server.headless") + 1] == "true"
    assert cmd[-2:] == ["--", str(tmp_path.resolve())] and "8765" in cmd
    assert launch.main([str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_dashboard_never_imports_torch_or_the_trainer(tmp_path_factory):
    """Import every module and render every page on the fixture runs (the Compare page runs
    ``audit.compare``); then look at what got imported."""
    from tests.fixtures_dashboard import shared_root

    root = shared_root(tmp_path_factory.getbasetemp())
    code = f"""
import os, sys
os.environ["ENVACE_DASHBOARD_ROOT"] = {str(root)!r}
import dashboard, dashboard.data, dashboard.readers, dashboard.runs, dashboard.ui
import dashboard.charts, dashboard.conversation, dashboard.jsondiff, dashboard.align
import dashboard.launch
from streamlit.testing.v1 import AppTest
at = AppTest.from_file({str(ROOT / "dashboard" / "app.py")!r}, default_timeout=60)
at.query_params["run"] = "demo"
at.run()
for p in ["training", "fidelity", "trajectories", "compare", "rehearsal"]:
    at.switch_page(f"views/{{p}}.py").run()
    assert not at.exception, p
assert "audit.compare" in sys.modules
bad = [m for m in sys.modules if m in ("torch", "transformers") or m.startswith(
    ("envace.training", "envace.model", "envace.evaluation", "envace.cli"))]
print(",".join(bad)); sys.exit(1 if bad else 0)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, f"imports {r.stdout.strip()} {r.stderr[-1500:]}"


# ---------------------------------------------------------------- a step's headings


def _render_step_app(source_rehearsed: bool) -> None:
    from dashboard.conversation import render_step

    render_step({"step": 0, "tool": "ls", "arguments": {}, "diverged": False,
                 "rehearsed": '{"a": 1}', "actual": '{"a": 1}',
                 "source_rehearsed": source_rehearsed}, None)


@pytest.mark.parametrize("rehearsed", [True, False])
def test_a_steps_left_column_names_who_wrote_the_recorded_response(rehearsed):
    from streamlit.testing.v1 import AppTest

    from dashboard.conversation import RECORDED_REAL, RECORDED_REHEARSED

    at = AppTest.from_function(_render_step_app, args=(rehearsed,), default_timeout=60).run()
    assert not at.exception
    captions = [c.value for c in at.caption]
    want, never = ((RECORDED_REHEARSED, RECORDED_REAL) if rehearsed
                   else (RECORDED_REAL, RECORDED_REHEARSED))
    assert want in captions and never not in captions
