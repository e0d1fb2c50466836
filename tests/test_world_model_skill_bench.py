"""bench.world_model_skill's pure logic: cells, seeds, the best world model as probe args."""

from __future__ import annotations

import pytest

from bench.world_model_skill import (
    base_label,
    best_cell,
    cell_result,
    parse_built,
    parse_cell,
    rows_for,
)


def test_parse_cell_and_seed_labels():
    assert parse_cell("tiny + hybrid=--model data/models/tiny-sft --hybrid train.jsonl") == (
        "tiny + hybrid", ["--model", "data/models/tiny-sft", "--hybrid", "train.jsonl"])
    for bad in ("no-equals", "=--model x", "label="):
        with pytest.raises(ValueError, match="LABEL=PROBE-ARGS"):
            parse_cell(bad)
    assert base_label("envace 30 steps#s2") == "envace 30 steps"
    assert base_label("a#b") == "a#b" and base_label("x#s") == "x#s"


def _summary(point, lo, hi):
    return {"skill": {"by_scorer": {"exact": {"point": point, "lo": lo, "hi": hi, "n": 10,
                                              "f_model": 0.5, "f_ref": 0.4,
                                              "best_reference": "lookup"}},
                      "by_mutates_state": {"exact": {"read": {"point": 0.1}}},
                      "by_novelty": {"exact": {}}},
            "divergence_rate": 0.5}


def test_best_cell_is_the_highest_skill_point_with_its_files():
    cells = {"a": {**cell_result(_summary(-0.2, -0.3, -0.1)), "probe_args": ["--model", "m"]},
             "b": {**cell_result(_summary(0.05, 0.01, 0.09)),
                   "probe_args": ["--model", "m", "--hybrid", "train.jsonl"]},
             "c": {**cell_result({}), "probe_args": ["--model", "n"]}}
    best = best_cell(cells)
    assert best["label"] == "b" and best["probe_args"][-1] == "train.jsonl"
    assert best["skill"]["lo"] == 0.01
    assert best["files"] == {"train.jsonl": "envace data export-real --split train "
                                            "--out train.jsonl"}
    assert best_cell({"c": cells["c"]}) is None
    # a model folder made by a command: the command travels with the best cell's arguments
    built = dict([parse_built("m=envace sft --roles rehearse --out m"),
                  parse_built("n=envace sft --out n")])
    assert best_cell(cells, built)["files"] == {
        "m": "envace sft --roles rehearse --out m",
        "train.jsonl": "envace data export-real --split train --out train.jsonl"}
    for bad in ("no-equals", "=cmd", "path="):
        with pytest.raises(ValueError, match="PATH=COMMAND"):
            parse_built(bad)


def test_rows_add_a_mean_over_seeds():
    cells = {f"run#s{i}": {**cell_result(_summary(p, p - 0.1, p + 0.1)), "probe_args": []}
             for i, p in enumerate([0.1, 0.3])}
    rows = rows_for(cells)
    assert len(rows) == 3
    assert rows[-1][0] == "run (mean of 2 seeds)" and rows[-1][4] == "+0.200"
    assert rows[0][6] == "+0.100"  # skill on read tools
