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


# ------------------------------------------------- round 5: what --out may be, what it writes


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def test_an_out_that_is_a_file_is_refused_and_kept(tmp_path):
    """Tester round 5: `--out FILE` (an existing regular file) was a FileExistsError traceback."""
    (tmp_path / "f").write_text("mine\n")
    r = board(tmp_path, "--models", "m.yaml", "--envs", "bfcl", "--limit", "1", "--out", "f")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("envace board: --out f exists and is "
                                                        "not a directory")
    assert (tmp_path / "f").read_text() == "mine\n"


def test_the_models_file_inside_out_is_never_written_over(tmp_path):
    """Tester round 5 (a): `--models ov/board.md --out ov` replaced the models file with the
    report."""
    (tmp_path / "ov").mkdir()
    models = tmp_path / "ov" / "board.md"
    models.write_text("models:\n  lookup: {reference: lookup}\n")
    r = board(tmp_path, "--models", "ov/board.md", "--envs", "bfcl", "--limit", "1",
              "--out", "ov")
    assert r.returncode == 2 and "ov/board.md is an input" in r.stderr, r.stderr
    assert sorted(p.name for p in (tmp_path / "ov").iterdir()) == ["board.md"]
    assert models.read_text() == "models:\n  lookup: {reference: lookup}\n"


def test_a_models_file_beside_a_board_is_fine(small):
    """The rule is about the board's own files: a models file elsewhere in --out is read."""
    (small / "m.yaml").unlink(missing_ok=True)
    r = board(small, "--models", "m.yaml", "--envs", "bfcl", "--limit", "1", "--out", ".")
    assert r.returncode == 0, r.stderr
    assert (small / "m.yaml").read_text().startswith("models:")


@pytest.mark.parametrize("content", ['{"x": 1}\n', '{"schema": "envace.board/1", "spl', ""],
                         ids=["foreign", "truncated", "empty"])
def test_a_foreign_board_json_is_refused_and_kept(tmp_path, content):
    """Tester round 5 (b): an --out holding a board.json that is not a board was overwritten."""
    out = tmp_path / "o"
    out.mkdir()
    (out / "board.json").write_text(content)
    r = board(tmp_path, "--models", "m.yaml", "--envs", "bfcl", "--limit", "1", "--out", "o")
    assert r.returncode == 2 and "not a board of envace board" in r.stderr, r.stderr
    assert _tree(out) == {"board.json": content.encode()}


def test_a_directory_of_other_files_is_refused(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    r = board(tmp_path, "--models", "m.yaml", "--envs", "bfcl", "--limit", "1", "--out", "o")
    assert r.returncode == 2 and "notes.txt" in r.stderr and "no board.json" in r.stderr
    assert _tree(out) == {"notes.txt": b"mine"}


@pytest.mark.parametrize("where", ["cells/lookup/bfcl", "cells/lookup/bfcl.cell.json",
                                   "cells/lookup", "board.md", "board.log", "charts"])
def test_a_link_where_the_board_writes_is_refused_and_what_it_points_to_is_kept(
        small, tmp_path, where):
    """Tester round 5 (c): a cell directory that was a link to another audit (its .cell.json
    marked failed) made the rerun replace that other audit."""
    models = parse_models({"models": {"lookup": {"reference": "lookup"}}})
    run_board(models, ["bfcl"], small, BoardOptions(quiet=True))
    other = tmp_path / "other"
    other.mkdir()
    (other / "summary.json").write_text('{"another": "audit"}')
    link = small / where
    moved = tmp_path / "moved"
    os.rename(link, moved)  # the board's own, put aside; the link takes its place
    link.symlink_to(other, target_is_directory=True)
    before = _tree(small)
    try:
        with pytest.raises(UsageError, match=f"{where} is a symbolic link"):
            run_board(models, ["bfcl"], small, BoardOptions(quiet=True))
        assert _tree(other) == {"summary.json": b'{"another": "audit"}'}
        assert _tree(small) == before and link.is_symlink()
    finally:
        link.unlink()
        os.rename(moved, link)


def test_a_lone_surrogate_in_a_model_path_is_written_as_its_escape(tmp_path):
    """Tester round 5: `model: "/tmp/x\\ud800y"` was a UnicodeEncodeError traceback in
    write_board that left board.json.tmp and .board.lock behind."""
    seed_inputs(tmp_path / "b", "bfcl", 1, 4)
    (tmp_path / "m.yaml").write_text('models:\n  s: {model: "/tmp/x\\ud800y"}\n'
                                     '  lookup: {reference: lookup}\n')
    r = board(tmp_path, "--models", "m.yaml", "--envs", "bfcl", "--limit", "1", "--out", "b")
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr  # the model's cell fails
    out = tmp_path / "b"
    data = json.loads((out / "board.json").read_text(encoding="utf-8"))
    assert data["models"]["s"] == {"model": "/tmp/x\ud800y"}  # the same text read back
    assert "\\ud800" in (out / "board.md").read_text(encoding="utf-8")
    assert "\\ud800" in (out / "board.log").read_text(encoding="utf-8")
    assert json.loads((out / "cells" / "s" / "bfcl.cell.json").read_text())["status"] == "failed"
    left = [p.name for p in out.iterdir() if p.name.endswith((".tmp", ".partial"))]
    assert left == [] and not (out / LOCK_FILE).exists()


def test_a_failure_while_writing_leaves_no_temporary_and_no_lock(small, monkeypatch):
    """Fault injection (a fake encoder, this test only): whatever fails while the board file is
    written, neither its temporary nor the lock stays behind, and the old board.json is kept."""
    import envace.core.board as core_board

    models = parse_models({"models": {"lookup": {"reference": "lookup"}}})
    run_board(models, ["bfcl"], small, BoardOptions(quiet=True))
    kept = (small / "board.json").read_bytes()

    def broken(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(core_board, "json_text", broken)
    with pytest.raises(OSError, match="No space"):
        run_board(models, ["bfcl"], small, BoardOptions(quiet=True))
    assert (small / "board.json").read_bytes() == kept
    assert [p.name for p in small.iterdir() if p.name.endswith((".tmp", ".partial"))] == []
    assert not (small / LOCK_FILE).exists()
