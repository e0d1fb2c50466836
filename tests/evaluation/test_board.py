"""`envace board` (envace.evaluation.board): references, the ranker and the tiny model on small
splits, resume, invalidation of exactly the changed cells, the board.json spec round trip, and
the models file's errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envace.core.board import (
    BOARD_VERSION,
    Board,
    BoardError,
    Cell,
    Interval,
    read_board,
    write_board,
)
from envace.core.envs.family import family
from envace.core.errors import UsageError
from envace.core.export import export_real
from envace.core.schema import TrajectoryWriter
from envace.evaluation.board import BoardOptions, run_board
from envace.evaluation.board_models import parse_models

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "data" / "models" / "tiny-sft")


def seed_inputs(out: Path, env: str, n_dev: int, n_train: int) -> None:
    """Small inputs where the board looks for them (it keeps existing files): fast cells. The
    directory gets a board.json with no cells, as a board stopped during its export leaves it:
    the board writes only into a new or empty directory or one of its own boards."""
    if not (out / "board.json").exists():
        write_board(out, Board(split="dev", envs=[], models={}, cells=[]))
    folder = out / "inputs" / env
    folder.mkdir(parents=True, exist_ok=True)
    fam = family(env)
    for split, n in (("dev", n_dev), ("train", n_train)):
        with TrajectoryWriter(folder / f"{split}.jsonl", mode="w") as w:
            for t in export_real(fam.split_tasks(split, "task")[:n]):
                w.write(t)


def log_lines(out: Path) -> list[str]:
    return (out / "board.log").read_text().splitlines()


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    out = tmp_path_factory.mktemp("board")
    seed_inputs(out, "bfcl", 2, 12)
    models = parse_models({"models": {
        "lookup": {"reference": "lookup"}, "edit": {"reference": "edit"},
        "ranker": {"ranker": True}, "tiny": {"model": TINY, "max_new_tokens": 8}}})
    board = run_board(models, ["bfcl"], out, BoardOptions(quiet=True))
    return out, models, board


def test_every_cell_is_an_audit_directory_summarised_on_the_board(full):
    out, _, board = full
    assert [c.status for c in board.cells] == ["done"] * 4, [c.error for c in board.cells]
    again = read_board(out)
    assert again == board  # the spec round trip through the file
    for c in board.cells:
        summary = json.loads((out / c.dir / "summary.json").read_text())
        assert summary["schema"] == "envace.audit/2"
        mean = summary["scores"]["exact"]
        assert (c.exact.point, [c.exact.lo, c.exact.hi]) == (mean["mean"], mean["ci"])
        assert c.exact.lo <= c.exact.point <= c.exact.hi
        assert c.calls == summary["counts"]["scored_steps"] > 0
        assert c.by_state_change and sum(s.n for s in c.by_state_change.values()) == c.calls
        assert set(c.read_write) <= {"read", "write", "unknown"}
    best = board.cells[0].best_reference
    assert best in ("lookup", "edit") and all(c.best_reference == best for c in board.cells)
    ref = board.cell(best, "bfcl")
    assert (ref.skill.point, ref.skill.lo, ref.skill.hi) == (0.0, 0.0, 0.0)  # itself
    assert board.cell("tiny", "bfcl").audited_model.endswith("tiny-sft")
    assert board.cell("ranker", "bfcl").audited_model.startswith("ranker(")
    assert (out / "charts" / "bfcl.png").stat().st_size > 0
    md = (out / "board.md").read_text()
    assert "| ranker |" in md and "cells/tiny/bfcl" in md and "charts/bfcl.png" in md
    lines = log_lines(out)
    assert sum(": running on" in x for x in lines) == 4
    assert sum(": done in" in x for x in lines) == 4


def test_a_second_run_recomputes_nothing_and_a_changed_model_only_its_cell(full):
    out, models, _ = full
    stamps = {c: (out / "cells" / c / "bfcl" / "summary.json").stat().st_mtime_ns
              for c in ("lookup", "edit", "ranker", "tiny")}
    before = len(log_lines(out))
    run_board(models, ["bfcl"], out, BoardOptions(quiet=True))
    new = log_lines(out)[before:]
    assert sum("finished earlier" in x for x in new) == 4 and not any("running" in x for x in new)
    changed = dict(models)
    changed["tiny"] = parse_models({"models": {"tiny": {"model": TINY, "max_new_tokens": 9}}}
                                   )["tiny"]
    before = len(log_lines(out))
    board = run_board(changed, ["bfcl"], out, BoardOptions(quiet=True))
    new = log_lines(out)[before:]
    assert [x.split("] ")[1].split(":")[0] for x in new if ": running on" in x] == ["tiny x bfcl"]
    for c in ("lookup", "edit", "ranker"):
        assert (out / "cells" / c / "bfcl" / "summary.json").stat().st_mtime_ns == stamps[c]
    assert board.models["tiny"]["max_new_tokens"] == 9


def test_a_changed_input_invalidates_exactly_the_cells_that_read_it(tmp_path):
    seed_inputs(tmp_path, "bfcl", 2, 8)
    seed_inputs(tmp_path, "agentdojo", 2, 6)
    models = parse_models({"models": {"lookup": {"reference": "lookup"},
                                      "majority": {"reference": "majority"}}})
    run_board(models, ["bfcl", "agentdojo"], tmp_path, BoardOptions(quiet=True))
    dev = tmp_path / "inputs" / "agentdojo" / "dev.jsonl"
    dev.write_text(dev.read_text().splitlines(keepends=True)[0])  # one trajectory fewer
    before = len(log_lines(tmp_path))
    board = run_board(models, ["bfcl", "agentdojo"], tmp_path, BoardOptions(quiet=True))
    new = log_lines(tmp_path)[before:]
    ran = sorted(x.split("] ")[1].split(":")[0] for x in new if ": running on" in x)
    assert ran == ["lookup x agentdojo", "majority x agentdojo"]
    assert board.cell("lookup", "agentdojo").trajectories == 1
    assert board.cell("lookup", "bfcl").trajectories == 2


def test_a_failed_cell_is_recorded_and_tried_again(tmp_path):
    seed_inputs(tmp_path, "bfcl", 1, 4)
    models = parse_models({"models": {"lookup": {"reference": "lookup"},
                                      "gone": {"model": str(tmp_path / "no-such-model")}}})
    board = run_board(models, ["bfcl"], tmp_path, BoardOptions(quiet=True))
    assert board.cell("lookup", "bfcl").status == "done"
    gone = board.cell("gone", "bfcl")
    assert gone.status == "failed" and gone.error
    before = len(log_lines(tmp_path))
    run_board(models, ["bfcl"], tmp_path, BoardOptions(quiet=True))
    new = log_lines(tmp_path)[before:]
    assert any("gone x bfcl: running" in x for x in new)
    assert any("lookup x bfcl: finished earlier" in x for x in new)


def test_the_models_file_is_checked_before_anything_runs(tmp_path):
    for bad, why in (({"models": {"x": {}}}, "exactly one of"),
                     ({"models": {"x": {"reference": "lookup", "memory_k": 3}}}, "generates"),
                     ({"models": {"x": {"reference": "oracle"}}}, "reference"),
                     ({"models": {"x": {"endpoint": "http://h:1/v1"}}}, "URL#model"),
                     ({"models": {"x": {"model": "m", "temperature": 1}}}, "temperature"),
                     ({"models": {"a b": {"ranker": True}}}, "letters"),
                     ({"model": {}}, "models:")):
        with pytest.raises(UsageError, match=why):
            parse_models(bad)
    served = parse_models({"models": {"s": {"endpoint": "http://h:1/v1#m",
                                            "score": "likelihood"}}})
    with pytest.raises(UsageError, match="likelihood"):
        run_board(served, ["bfcl"], tmp_path / "b", BoardOptions(quiet=True))
    assert not (tmp_path / "b").exists()  # refused before anything was written


def test_likelihood_is_refused_clearly_without_the_likelihood_audit(tmp_path, monkeypatch):
    import envace.evaluation.board as board_mod

    monkeypatch.setattr(board_mod, "likelihood_available", lambda: False)
    models = parse_models({"models": {"s": {"model": TINY, "score": "likelihood"}}})
    with pytest.raises(UsageError, match="envace probe --likelihood"):
        run_board(models, ["bfcl"], tmp_path / "b", BoardOptions(quiet=True))
    assert not (tmp_path / "b").exists()


def test_a_likelihood_cell_has_bits_per_byte(tmp_path):
    pytest.importorskip("envace.evaluation.likelihood")  # the likelihood audit (issue 42)
    seed_inputs(tmp_path, "bfcl", 1, 4)
    models = parse_models({"models": {"s": {"model": TINY, "score": "likelihood"}}})
    board = run_board(models, ["bfcl"], tmp_path, BoardOptions(quiet=True))
    cell = board.cell("s", "bfcl")
    assert cell.status == "done", cell.error
    assert cell.bits_per_byte is not None and cell.bits_per_byte.point > 0
    summary = json.loads((tmp_path / cell.dir / "summary.json").read_text())
    assert summary["counts"]["scored_steps"] == 0  # nothing generated ...
    assert cell.calls == summary["likelihood"]["steps"] > 0  # ... every real response scored
    assert cell.trajectories == 1


def test_the_board_file_round_trips_and_refuses_what_it_cannot_read(tmp_path):
    board = Board(split="dev", envs=["bfcl"], models={"lookup": {"reference": "lookup"}},
                  cells=[Cell(model="lookup", env="bfcl", dir="cells/lookup/bfcl", key="k",
                              exact=Interval(point=0.5, lo=0.4, hi=0.6), newer_field=1)])
    write_board(tmp_path, board)
    data = json.loads((tmp_path / "board.json").read_text())
    assert data["schema"] == BOARD_VERSION and data["cells"][0]["exact"] == {
        "point": 0.5, "lo": 0.4, "hi": 0.6}
    assert data["cells"][0]["newer_field"] == 1  # a field a newer writer adds is kept
    assert read_board(tmp_path) == board
    for text, why in (("{", "not JSON"), ('{"schema": "envace.board/9"}', "schema"),
                      (json.dumps({**data, "cells": [{"model": 1}]}), "cells")):
        (tmp_path / "board.json").write_text(text)
        with pytest.raises(BoardError, match=why):
            read_board(tmp_path)


def test_the_command_refuses_bad_usage_with_exit_2(tmp_path):
    models = tmp_path / "m.yaml"
    models.write_text("models: {lookup: {reference: lookup}}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args in (["--envs", "nosuchenv"], ["--envs", "bfcl", "--split", "train"],
                 ["--envs", "bfcl", "--limit", "-1"]):
        r = subprocess.run([sys.executable, "-m", "envace.cli", "board", "--models", str(models),
                            "--out", str(tmp_path / "o"), *args], capture_output=True,
                           text=True, env=env)
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith("envace board: ")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A confidence cell and a reference, first with the real history, then ``--history both``."""
    out = tmp_path_factory.mktemp("board_graded")
    seed_inputs(out, "bfcl", 2, 6)
    models = parse_models({"models": {
        "lookup": {"reference": "lookup"},
        "tiny-c": {"model": TINY, "max_new_tokens": 8, "confidence": True}}})
    real = run_board(models, ["bfcl"], out, BoardOptions(quiet=True))
    mark = len(log_lines(out))
    both = run_board(models, ["bfcl"], out, BoardOptions(quiet=True, history="both"))
    return out, real, both, log_lines(out)[mark:]


def test_a_confidence_cell_has_its_audits_coverage_and_auroc(graded):
    out, real, both, _ = graded
    for board in (real, both):
        cell = board.cell("tiny-c", "bfcl")
        assert cell.status == "done", cell.error
        block = json.loads((out / cell.dir / "summary.json").read_text())["confidence"]
        assert cell.coverage_at_5pct == block["coverage_at_risk"]["5%"]["coverage"]
        assert 0.0 <= cell.coverage_at_5pct <= 1.0
        assert cell.auroc.point == block["auroc"]["point"]
        assert [cell.auroc.lo, cell.auroc.hi] == (block["auroc"]["ci"] or [None, None])
    assert "--confidence" in real.cell("tiny-c", "bfcl").command
    ref = real.cell("lookup", "bfcl")  # no confidence recorded: null, not 0
    assert ref.coverage_at_5pct is None and ref.auroc is None and ref.history_diff is None
    md = (out / "board.md").read_text()
    assert "coverage ≤5% div." in md and "own − real div." in md


def test_history_both_gives_the_audits_own_minus_real_divergence(graded):
    out, real, both, _ = graded
    assert real.cell("tiny-c", "bfcl").history_diff is None
    cell = both.cell("tiny-c", "bfcl")
    summary = json.loads((out / cell.dir / "summary.json").read_text())
    diff = summary["history"]["overall"]["diff"]
    assert cell.history_diff.point == diff["diff"]
    assert [cell.history_diff.lo, cell.history_diff.hi] == (diff["ci"] or [None, None])
    assert summary["counts"]["own_history_steps"] == cell.calls
    assert cell.command.endswith("--history both")
    assert read_board(out) == both  # the new fields round-trip through board.json


def test_history_both_recomputes_exactly_the_generating_cells(graded):
    _, real, both, new = graded
    ran = [x.split("] ")[1].split(":")[0] for x in new if ": running on" in x]
    assert ran == ["tiny-c x bfcl"]
    assert any("lookup x bfcl: finished earlier" in x for x in new)
    assert real.cell("lookup", "bfcl").key == both.cell("lookup", "bfcl").key
    assert real.cell("tiny-c", "bfcl").key != both.cell("tiny-c", "bfcl").key


def test_confidence_is_refused_where_nothing_scores_the_answers():
    for spec in ({"reference": "lookup", "confidence": True},
                 {"ranker": True, "confidence": True},
                 {"endpoint": "http://h:1/v1#m", "confidence": True},
                 {"model": "m", "score": "likelihood", "confidence": True}):
        with pytest.raises(UsageError, match="confidence"):
            parse_models({"models": {"x": spec}})


def test_a_served_model_with_its_tokenizer_is_asked_the_in_process_prompts(tmp_path):
    """An endpoint with ``tokenizer`` (and ``context``): the cell's prompts are cut as the
    in-process probe cuts them and sent as token ids; the cell's command says so. The server is
    the standard library's HTTP server answering a fixed text (`tests.model.test_endpoint`'s
    FakeOpenAI): only what the board sends is under test here; the real vLLM server's answers
    are compared with the in-process probe's in `tests/vllm/test_vllm_likelihood.py`."""
    import threading
    from http.server import ThreadingHTTPServer

    from tests.model.test_endpoint import FakeOpenAI, _handler

    state = FakeOpenAI()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        seed_inputs(tmp_path, "bfcl", 1, 4)
        models = parse_models({"models": {"served": {
            "endpoint": f"{url}#world", "tokenizer": TINY, "context": 400,
            "max_new_tokens": 64}}})
        board = run_board(models, ["bfcl"], tmp_path, BoardOptions(quiet=True))
    finally:
        httpd.shutdown()
        httpd.server_close()
    cell = board.cell("served", "bfcl")
    assert cell.status == "done", cell.error
    assert f"--tokenizer {TINY} --context 400" in cell.command
    sent = [b["prompt"] for b in state.requests]
    assert sent and all(isinstance(p, list) and len(p) <= 400 - 64 for p in sent)
    summary = json.loads((tmp_path / cell.dir / "summary.json").read_text())
    assert summary["endpoint"]["prompt"].startswith("token ids, cut to 400 tokens")


def test_tokenizer_and_context_go_where_they_cut_prompts():
    for spec, why in (({"model": TINY, "tokenizer": TINY}, "tokenizer is a served model's"),
                      ({"reference": "lookup", "context": 512}, "context cuts a model's"),
                      ({"endpoint": "http://h:1/v1#m", "context": 512}, "needs its tokenizer"),
                      ({"model": TINY, "context": 8}, "greater than or equal to 64"),
                      ({"model": TINY, "context": 300}, "leaves no room")):
        with pytest.raises(UsageError, match=why):
            parse_models({"models": {"x": spec}})
    ok = parse_models({"models": {"x": {"endpoint": "http://h:1/v1#m", "tokenizer": TINY}}})
    assert ok["x"].given() == {"endpoint": "http://h:1/v1#m", "tokenizer": TINY}
