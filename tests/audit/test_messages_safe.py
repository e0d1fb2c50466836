"""Issue #39: what a command prints stays exact and safe: a skipped record that is a whole file
(an unreadable summary.json) is named by its file alone, never ``summary.json:None``; matplotlib's
warnings become notes of the report, never raw terminal output."""

from __future__ import annotations

import json

from audit.cli import main
from audit.store.models import place


def _audit(d, summary: str) -> None:
    d.mkdir()
    rows = [{"trajectory_id": f"t{i}", "task_id": f"k{i}", "step": 0, "tool": "ls",
             "actual": "{}", "diverged": bool(i % 2), "rehearsed": "{}", "scores": {}}
            for i in range(4)]
    (d / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(summary)


def test_an_unreadable_summary_is_named_by_its_file(tmp_path, capsys):
    _audit(tmp_path / "a", "{ not json")
    _audit(tmp_path / "b", "{}")
    rc = main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out",
               str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert rc == 3 and "summary.json: invalid JSON" in err
    md = (tmp_path / "c" / "compare.md").read_text()
    assert ":None" not in err + md and "summary.json: invalid JSON" in md
    assert place({"file": "f.jsonl", "line": 3}) == "f.jsonl:3"


def test_matplotlib_warnings_become_safe_notes_not_terminal_output(tmp_path, capfd):
    """A tool name with glyphs the font lacks (and controls) made matplotlib print a warning,
    name included, raw on the terminal; now it is a note of the report, made safe."""
    import warnings

    from audit.store.report import plot_all

    s = {"by_tool": {"中文\x1b[31m": {"n": 2, "divergence_rate": 0.5}},
         "by_depth": [{"depth": 0, "divergence_rate": 0.5, "divergence_ci": [0.5, 0.5]}]}
    notes: list[str] = []
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        assert plot_all(tmp_path, s, notes) == ["depth.png", "tools.png"]
    assert escaped == [] and capfd.readouterr().err == ""
    assert any("missing from font" in n for n in notes)
    assert not any("\x1b" in n for n in notes)
