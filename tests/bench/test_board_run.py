"""bench.board_run: one real `envace board` run recorded with its command, load and board."""

from __future__ import annotations

import json
from pathlib import Path

import bench.machine
from bench import board_run
from tests.evaluation.test_board import seed_inputs


def test_records_the_board_it_ran(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(bench.machine, "RESULTS", tmp_path / "results")
    out = tmp_path / "board"
    seed_inputs(out, "bfcl", 2, 8)  # small inputs: the board keeps existing files
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  lookup: {reference: lookup}\n  edit: {reference: edit}\n")
    rc = board_run.main(["--models", str(models), "--envs", "bfcl", "--out", str(out),
                         "--name", "b", "--", "--quiet"])
    assert rc == 0
    rec = json.loads((tmp_path / "results" / "b.json").read_text())
    assert rec["returncode"] == 0 and rec["wall_seconds"] > 0
    assert rec["models_file"] == models.read_text()
    assert "--quiet" in rec["command"] and set(rec["load_average"]) == {"start", "end"}
    cells = rec["board"]["cells"]
    assert [(c["model"], c["env"], c["status"]) for c in cells] == [
        ("lookup", "bfcl", "done"), ("edit", "bfcl", "done")]
    assert rec["board"] == json.loads((out / "board.json").read_text())


def test_a_failed_board_is_recorded_with_its_exit_code(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(bench.machine, "RESULTS", tmp_path / "results")
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  x: {reference: nonsense}\n")
    rc = board_run.main(["--models", str(models), "--envs", "bfcl", "--out",
                         str(tmp_path / "b"), "--name", "f"])
    rec = json.loads((tmp_path / "results" / "f.json").read_text())
    assert rc != 0 and rec["returncode"] == rc
