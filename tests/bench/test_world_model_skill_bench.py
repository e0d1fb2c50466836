"""experiments.world_model_skill's pure logic: cells, seeds, the best world model as probe args."""

from __future__ import annotations

import shlex

import pytest

from experiments.world_model_skill import (
    base_label,
    best_cell,
    cell_result,
    command_for,
    exports,
    main,
    parse_built,
    parse_cell,
    previous_cells,
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
    assert rows[-1][0] == "run (mean of 2 seeds, vs lookup)" and rows[-1][3] == "+0.200"
    assert rows[0][8] == "+0.100"  # skill on read tools
    assert rows[0][5] == "n/a"  # measured against the lookup only


def test_rows_and_best_read_skill_against_each_reference():
    """A cell of an audit with the ``edit`` reference shows its skill against both; the best
    is ranked against the lookup, which every cell has."""
    def summary(vs_lookup, vs_edit):
        s = _summary(vs_edit, vs_edit - 0.1, vs_edit + 0.1)
        s["skill"]["by_scorer"]["exact"]["best_reference"] = "edit"
        s["skill"]["by_scorer"]["exact"]["against"] = {
            "lookup": {"point": vs_lookup, "lo": vs_lookup - 0.05, "hi": vs_lookup + 0.05},
            "edit": {"point": vs_edit, "lo": vs_edit - 0.1, "hi": vs_edit + 0.1}}
        return s
    cells = {"old": {**cell_result(_summary(0.02, -0.01, 0.05)), "probe_args": ["--model", "o"]},
             "new#s0": {**cell_result(summary(0.10, -0.05)), "probe_args": ["--model", "n"]},
             "new#s1": {**cell_result(summary(0.06, -0.09)), "probe_args": ["--model", "n"]}}
    rows = rows_for(cells)
    assert rows[1][3:8] == ["+0.100", "[+0.050, +0.150]", "-0.050", "[-0.150, +0.050]", "edit"]
    assert rows[0][3] == "+0.020" and rows[0][5] == "n/a"
    means = {r[0]: r for r in rows[3:]}
    assert means["new (mean of 2 seeds, vs lookup)"][3] == "+0.080"
    assert means["new (mean of 2 seeds, vs edit)"][5] == "-0.070"
    assert best_cell(cells)["label"] == "new#s0"


def _kept_summary(point: float) -> dict:
    return {"skill": {"by_scorer": {"exact": {"point": point, "lo": point - 0.1,
                                              "hi": point + 0.1, "f_model": 0.5, "f_ref": 0.5,
                                              "n": 10, "best_reference": "lookup"}}},
            "divergence_rate": 0.5, "audited_model": "m"}


def test_merge_keeps_earlier_cells_and_replaces_a_label_probed_again(tmp_path, monkeypatch):
    """`--merge --collect`: the cells of the existing result file stay as measured, a label
    read again is replaced, the best is chosen over all of them, and the recorded command
    probes every cell (with every --built command)."""
    import json
    import shlex

    from bench import machine
    from envace.core.layout import AUDIT

    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(machine, "RESULTS", results)
    old = {"cells": {
        "old": {**cell_result(_kept_summary(-0.2)), "probe_args": ["--model", "a"]},
        "new#s0": {**cell_result(_kept_summary(-0.9)), "probe_args": ["--model", "b"]}},
        "built": {"a": "make a"}}
    (results / "wm.json").write_text(json.dumps(old))
    keep = tmp_path / "keep"
    (keep / "new_s0").mkdir(parents=True)
    (keep / "new_s0" / AUDIT.summary).write_text(json.dumps(_kept_summary(0.3)))
    assert main(["--cell", "new#s0=--model b --memory train.jsonl", "--keep", str(keep),
                 "--collect", "--merge", "--name", "wm", "--built", "b=make b"]) == 0
    got = json.loads((results / "wm.json").read_text())
    assert list(got["cells"]) == ["old", "new#s0"]
    assert got["cells"]["old"]["skill"]["point"] == -0.2
    assert got["cells"]["new#s0"]["skill"]["point"] == 0.3
    assert got["cells"]["new#s0"]["probe_args"] == ["--model", "b", "--memory", "train.jsonl"]
    assert got["best"]["label"] == "new#s0"
    assert got["best"]["files"] == {"train.jsonl": "envace data export-real --split train "
                                    "--out train.jsonl", "b": "make b"}
    assert got["built"] == {"a": "make a", "b": "make b"}
    argv = shlex.split(got["command"])
    assert argv[:3] == ["python", "-m", "experiments.world_model_skill"] and "--merge" not in argv
    cells = [argv[i + 1] for i, a in enumerate(argv) if a == "--cell"]
    assert [parse_cell(c) for c in cells] == [("old", ["--model", "a"]),
                                              ("new#s0", ["--model", "b", "--memory",
                                                          "train.jsonl"])]
    spaced = shlex.split(command_for({"x": ["--model", "a b"]}, {}))
    assert parse_cell(spaced[-1]) == ("x", ["--model", "a b"])  # a path with a space survives


def test_agentdojo_cells_export_and_record_its_splits():
    """--env agentdojo: the files are AgentDojo's, the best cell names their commands, and the
    recorded command probes the same environment into the same result file."""
    ad = exports("agentdojo")
    assert ad == {"train.jsonl": "envace data export-real --env agentdojo --split train "
                                 "--out train.jsonl",
                  "dev.jsonl": "envace data export-real --env agentdojo --split dev "
                               "--out dev.jsonl"}
    assert "--env" not in exports("bfcl")["train.jsonl"]
    cells = {"a": {**cell_result(_summary(0.1, 0.0, 0.2)),
                   "probe_args": ["--model", "m", "--hybrid", "train.jsonl"]}}
    assert best_cell(cells, {}, ad)["files"] == {"train.jsonl": ad["train.jsonl"]}
    argv = shlex.split(command_for({"a": ["--model", "m"]}, {}, env="agentdojo",
                                   name="world_model_skill_agentdojo", keep="runs/wm_ad"))
    assert argv[argv.index("--env") + 1] == "agentdojo"
    assert argv[argv.index("--name") + 1] == "world_model_skill_agentdojo"
    assert argv[argv.index("--keep") + 1] == "runs/wm_ad"
    assert "--env" not in shlex.split(command_for({"a": ["--model", "m"]}, {}))


def test_merge_refuses_a_missing_or_foreign_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        previous_cells(tmp_path / "none.json")
    (tmp_path / "x.json").write_text('{"cells": {"a": {"skill": {}}}}')
    with pytest.raises(ValueError, match="no world-model cells"):
        previous_cells(tmp_path / "x.json")


def test_the_test_split_is_read_once(tmp_path):
    """experiments.world_model_test: the best world model of the skill result, on test, once."""
    from experiments.world_model_test import TEST, best_of, previous_looks, probe_argv, refusal

    with pytest.raises(ValueError, match="no best world model"):
        best_of({"cells": {}})
    best = best_of({"best": {"label": "b", "probe_args": ["--model", "m", "--hybrid",
                                                          "train.jsonl"]}})
    argv = probe_argv(best["probe_args"], tmp_path, tmp_path / "out")
    assert argv[argv.index("--hybrid") + 1] == str(tmp_path / "train.jsonl")
    assert str(tmp_path / TEST) in argv and str(tmp_path / "dev.jsonl") not in argv
    assert argv[argv.index("--reference") + 1] == str(tmp_path / "train.jsonl")
    result = tmp_path / "r.json"
    assert previous_looks(result) == [] and refusal([], again=False) is None
    result.write_text('{"looks": [{"label": "b", "date": "2026-12-02"}]}')
    looks = previous_looks(result)
    assert "already read" in refusal(looks, again=False)
    assert refusal(looks, again=True) is None
    result.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        previous_looks(result)


def test_a_cell_records_the_unit_its_intervals_resample():
    s = {**_summary(-0.1, -0.2, 0.0), "resampling_unit": "scenario", "interval": {"clusters": 30}}
    s["skill"]["by_scorer"]["exact"].update(mc_error=0.004, method="bootstrap")
    c = cell_result(s)
    assert (c["resampling_unit"], c["clusters"]) == ("scenario", 30)
    assert (c["skill"]["mc_error"], c["skill"]["method"]) == (0.004, "bootstrap")
    assert cell_result({})["resampling_unit"] is None  # a summary from before issue 38


def test_merge_keeps_a_cell_whose_new_probe_left_no_audit(tmp_path, monkeypatch):
    """A label given again whose audit is not there (a probe that failed or has not finished)
    keeps its earlier figures instead of vanishing from the result file."""
    import json

    from bench import machine
    from envace.core.layout import AUDIT

    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(machine, "RESULTS", results)
    old = {"cells": {"a": {**cell_result(_kept_summary(-0.2)), "probe_args": ["--model", "a"]},
                     "b": {**cell_result(_kept_summary(-0.5)), "probe_args": ["--model", "b"]}}}
    (results / "wm.json").write_text(json.dumps(old))
    keep = tmp_path / "keep"
    (keep / "b").mkdir(parents=True)
    (keep / "b" / AUDIT.summary).write_text(json.dumps(_kept_summary(0.1)))
    assert main(["--cell", "a=--model a", "--cell", "b=--model b", "--keep", str(keep),
                 "--collect", "--merge", "--name", "wm"]) == 0
    got = json.loads((results / "wm.json").read_text())["cells"]
    assert list(got) == ["a", "b"]
    assert got["a"]["skill"]["point"] == -0.2 and got["b"]["skill"]["point"] == 0.1


def test_a_cell_records_how_its_model_folder_was_made(tmp_path):
    import json

    from experiments.world_model_skill import model_made, short_build_warning

    folder = tmp_path / "wm"
    folder.mkdir()
    cmd = ["envace", "sft", "--max-steps", "1200", "--out", str(folder)]
    (folder / "envace_sft.json").write_text(json.dumps(
        {"steps": 423, "stopped_by": "time budget", "settings": {"max_steps": 1200},
         "command": cmd}))
    made = model_made(["--model", str(folder), "--hybrid", "train.jsonl"])
    assert made == {"folder": str(folder), "steps": 423, "max_steps": 1200,
                    "stopped_by": "time budget", "command": shlex.join(cmd)}
    assert short_build_warning(made) == (f"warning: {folder} stopped by time budget at 423 "
                                         "of 1200 steps")
    (folder / "envace_sft.json").write_text(json.dumps(
        {"steps": 1200, "stopped_by": "max_steps", "settings": {"max_steps": 1200}}))
    assert short_build_warning(model_made(["--model", str(folder)])) is None
    (folder / "envace_sft.json").write_text(json.dumps({"steps": 300, "stopped_by": "epochs"}))
    assert short_build_warning(model_made(["--model", str(folder)])) is None
    # a preset name, a folder without the file, a broken file, no --model: nothing recorded
    assert model_made(["--model", "smollm2"]) is None
    assert model_made(["--ranker", "train.jsonl"]) is None and model_made(["--model"]) is None
    (folder / "envace_sft.json").write_text("{not json")
    assert model_made(["--model", str(folder)]) is None
