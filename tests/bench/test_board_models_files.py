"""bench/boards/: the models files behind the recorded boards are valid and are the files the
records ran (a board's record keeps its models file's text; the repository keeps the file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.evaluation.board_models import read_models

ROOT = Path(__file__).resolve().parents[2]
BOARDS = ROOT / "bench" / "boards"
RESULTS = ROOT / "bench" / "results"
#: record -> the models file it ran (board_dev.json predates recording the models file)
RECORDED = {"board_dev_models": "models-dev.yaml", "board_dev_smollm2": "models-smollm2.yaml",
            "board_dev_smollm2_gen": "models-smollm2-gen.yaml",
            "board_dev_smollm2_sft": "models-smollm2-sft.yaml",
            "board_dev_tiny_wm": "models-tiny-wm.yaml",
            "board_dev_tiny_vllm": "models-tiny-vllm.yaml",
            "board_dev_tiny_wm_seeds": "models-tiny-wm-seeds.yaml",
            "board_dev_tiny_wmm": "models-tiny-wmm.yaml"}


@pytest.mark.parametrize("path", sorted(BOARDS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_models_file_reads(path: Path) -> None:
    models = read_models(path)
    assert models, f"{path.name} names no model"


@pytest.mark.parametrize("record,name", sorted(RECORDED.items()))
def test_a_recorded_board_ran_the_models_file_kept_here(record: str, name: str) -> None:
    rec = json.loads((RESULTS / f"{record}.json").read_text())
    assert rec["models_file"] == (BOARDS / name).read_text(), (
        f"bench/boards/{name} is not the file {record}.json recorded")


def test_every_board_record_names_its_models_file_here() -> None:
    records = {p.stem for p in RESULTS.glob("board_dev*.json")} - {"board_dev"}
    with_file = {r for r in records if json.loads((RESULTS / f"{r}.json").read_text()).get(
        "models_file")}
    assert with_file <= set(RECORDED), (
        f"board records without their models file in bench/boards/: {with_file - set(RECORDED)}")
