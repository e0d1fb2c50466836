"""The dashboard's Board page (boards of `envace board`) and the Fidelity page's State change
tab, through ``streamlit.testing.v1.AppTest`` on a small board the library makes."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from envace.core.board import Board, Cell, Interval, read_board, write_board
from envace.evaluation.board import BoardOptions, run_board
from envace.evaluation.board_models import parse_models
from tests.evaluation.test_board import seed_inputs

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dash_board")
    out = root / "boards" / "dev"
    seed_inputs(out, "bfcl", 2, 6)
    models = parse_models({"models": {"lookup": {"reference": "lookup"},
                                      "edit": {"reference": "edit"}}})
    run_board(models, ["bfcl"], out, BoardOptions(quiet=True))
    return root


def _open(monkeypatch, root: Path, page: str, **query: str) -> AppTest:
    monkeypatch.setenv("ENVACE_DASHBOARD_ROOT", str(root))
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(query)
    at.run()
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_board_page_lists_every_cell_with_links_to_its_audit(monkeypatch, root):
    at = _open(monkeypatch, root, "board")
    board = read_board(root / "boards" / "dev")
    df = at.dataframe[0].value
    assert sorted(df["model"]) == ["edit", "lookup"]
    assert list(df["exact"]) == sorted(df["exact"], reverse=True)  # best first
    for c in board.cells:
        row = df[df["model"] == c.model].iloc[0]
        assert row["exact"] == pytest.approx(c.exact.point)
        assert row["exact lo"] == pytest.approx(c.exact.lo)
        run = quote(f"boards/dev/{c.dir}")
        assert row["fidelity"] == f"/fidelity?run={run}"
        assert row["trajectories"] == f"/trajectories?run={run}"
    assert any("split" in c.value and "2 cell" in c.value for c in at.caption)


def test_a_cell_link_opens_its_audit_with_the_state_change_tab(monkeypatch, root):
    at = _open(monkeypatch, root, "fidelity", run="boards/dev/cells/lookup/bfcl")
    shown = "\n".join(str(m.value) for m in at.markdown)
    assert "state-change cliff" in shown.lower()
    assert any("leaves changed" in list(d.value.columns) for d in at.dataframe)


def test_no_board_is_a_message_not_an_error(monkeypatch, tmp_path):
    at = _open(monkeypatch, tmp_path, "board")
    assert any("No board" in i.value for i in at.info)


def test_the_board_page_shows_coverage_auroc_and_own_minus_real(monkeypatch, tmp_path):
    out = tmp_path / "boards" / "graded"
    out.mkdir(parents=True)
    write_board(out, Board(split="dev", envs=["bfcl"], models={}, cells=[
        Cell(model="tiny-c", env="bfcl", dir="cells/tiny-c/bfcl", key="k1",
             exact=Interval(point=0.2), coverage_at_5pct=0.25,
             auroc=Interval(point=0.7, lo=0.6, hi=0.8),
             history_diff=Interval(point=0.05, lo=-0.01, hi=0.12)),
        Cell(model="lookup", env="bfcl", dir="cells/lookup/bfcl", key="k2",
             exact=Interval(point=0.5))]))
    at = _open(monkeypatch, tmp_path, "board")
    df = at.dataframe[0].value.set_index("model")
    assert df.loc["tiny-c", "coverage ≤5% div."] == pytest.approx(0.25)
    assert df.loc["tiny-c", "AUROC"] == pytest.approx(0.7)
    assert (df.loc["tiny-c", "own − real div."], df.loc["tiny-c", "own − real lo"],
            df.loc["tiny-c", "own − real hi"]) == pytest.approx((0.05, -0.01, 0.12))
    assert pd.isna(df.loc["lookup", "coverage ≤5% div."])  # absent: empty, not 0
    assert pd.isna(df.loc["lookup", "own − real div."])
