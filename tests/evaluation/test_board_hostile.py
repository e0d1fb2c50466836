"""`envace board` against the inputs a hostile tester tried (issue 39, round 3: B7, B8, B11, B17,
B21–B24): each is refused with exit 2 before anything is written, or costs only its own cell
(exit 3), never a traceback, a hang or a board that loses another's cells."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envace.core.errors import UsageError
from envace.evaluation import board_models
from envace.evaluation.board import LOCK_FILE, BoardOptions, run_board
from envace.evaluation.board_models import parse_models
from tests.evaluation.test_board import seed_inputs

ROOT = Path(__file__).resolve().parents[2]


def board(tmp: Path, *args: str, models: str = "lookup: {reference: lookup}\n",
          timeout: float = 120) -> subprocess.CompletedProcess:
    m = tmp / "m.yaml"
    if not m.exists():
        m.write_text("models:\n  " + models.replace("\n", "\n  "))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ENVACE_MCP_TASKS", None)
    return subprocess.run([sys.executable, "-m", "envace.cli.main", "board", "--quiet", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=tmp, env=env)


def test_a_fifo_models_file_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")
    r = board(tmp_path, "--models", "fifo.yaml", "--envs", "bfcl", "--out", "b", timeout=60)
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr
    assert not (tmp_path / "b").exists()


def test_an_endless_models_file_is_refused(tmp_path):
    r = board(tmp_path, "--models", "/dev/zero", "--envs", "bfcl", "--out", "b", timeout=60)
    assert r.returncode == 2 and "not a regular file" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args, says", [
    (["--envs", "bfcl", "--split", "../../tmp/x"], "no split"),
    (["--envs", "bfcl", "bfcl"], "twice"),
    (["--envs", "mcp:../../x"], "mcp"),
    (["--envs", "nosuchenv"], "nosuchenv"),
])
def test_a_bad_split_or_env_list_is_refused_before_anything_is_written(tmp_path, args, says):
    r = board(tmp_path, "--models", "m.yaml", *args, "--out", "b")
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "b").exists()


def test_a_second_board_into_the_same_directory_is_refused(tmp_path):
    out = tmp_path / "b"
    out.mkdir()
    fd = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another board holds it
    try:
        models = parse_models({"models": {"lookup": {"reference": "lookup"}}})
        with pytest.raises(UsageError, match="another envace board"):
            run_board(models, ["bfcl"], out, BoardOptions(quiet=True))
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing written
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile")
    seed_inputs(out, "bfcl", 2, 8)
    return out


def test_a_model_folder_that_cannot_be_fingerprinted_fails_its_cell_only(small, tmp_path,
                                                                          monkeypatch):
    folder = tmp_path / "huge"
    folder.mkdir()
    for i in range(4):
        (folder / f"f{i}").write_text("x")
    monkeypatch.setattr(board_models, "MAX_MODEL_FILES", 3)
    models = parse_models({"models": {"lookup": {"reference": "lookup"},
                                      "big": {"model": str(folder)}}})
    b = run_board(models, ["bfcl"], small, BoardOptions(quiet=True))
    status = {c.model: (c.status, c.error) for c in b.cells}
    assert status["lookup"][0] == "done"
    assert status["big"][0] == "failed" and "more than 3 files" in status["big"][1]


def test_a_tampered_finished_cell_is_computed_again(small):
    models = parse_models({"models": {"lookup": {"reference": "lookup"}}})
    first = run_board(models, ["bfcl"], small, BoardOptions(quiet=True)).cell("lookup", "bfcl")
    (small / first.dir / "summary.json").write_text(json.dumps({"scores": "x", "counts": [1]}))
    again = run_board(models, ["bfcl"], small, BoardOptions(quiet=True)).cell("lookup", "bfcl")
    assert again.status == "done" and again.exact == first.exact
    assert any("computed again" in line for line in (small / "board.log").read_text()
               .splitlines())


def test_a_finished_cell_whose_summary_became_a_fifo_fails_without_waiting(small):
    """Tester B17c: the reuse branch read the stored summary with a blocking read (a hang).
    Now the cell is computed again, and the audit writer refuses to write over a directory
    holding a file that is not an audit's: the cell fails, naming it; the board goes on."""
    models = parse_models({"models": {"lookup": {"reference": "lookup"}}})
    first = run_board(models, ["bfcl"], small, BoardOptions(quiet=True)).cell("lookup", "bfcl")
    stored = small / first.dir / "summary.json"
    stored.unlink()
    os.mkfifo(stored)
    again = run_board(models, ["bfcl"], small, BoardOptions(quiet=True)).cell("lookup", "bfcl")
    assert again.status == "failed" and "summary.json" in again.error
    stored.unlink()  # the directory is the board's again: the next run computes the cell
    third = run_board(models, ["bfcl"], small, BoardOptions(quiet=True)).cell("lookup", "bfcl")
    assert third.status == "done" and third.exact == first.exact


def test_a_model_named_twice_is_refused_naming_it_and_its_lines(tmp_path):
    """Tester round 5: `a` defined twice in models.yaml silently kept the last."""
    (tmp_path / "m.yaml").write_text("models:\n  a: {reference: lookup}\n  a: {reference: edit}\n")
    r = board(tmp_path, "--models", "m.yaml", "--envs", "bfcl", "--out", "b")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "envace board: --models m.yaml: the key 'a' is given twice (lines 2 and 3): keep one")
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "b").exists()
