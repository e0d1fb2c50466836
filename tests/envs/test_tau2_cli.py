"""τ² through the commands that take tasks and trajectories: export-real, the train-split check
of the memory and ranker, the split README writer, the training report's task unit."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from envace.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_export_real_by_domain_and_its_refusals(tmp_path, capsys):
    out = tmp_path / "a.jsonl"
    assert main(["data", "export-real", "--env", "tau2", "--split", "dev", "--domain", "airline",
                 "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [r["task_id"] for r in rows]
    assert len(ids) == 8 and all(i.startswith("airline/") for i in ids)
    assert all(r["env"] == {"name": "tau2", "task": r["task_id"]} and r["reward"] == 1.0
               for r in rows)
    assert rows[0]["messages"][0]["role"] == "system" and rows[0]["messages"][1]["role"] == "user"
    capsys.readouterr()
    assert main(["data", "export-real", "--env", "agentdojo", "--domain", "airline",
                 "--out", str(tmp_path / "b.jsonl")]) == 2
    assert "--domain is for --env tau2" in capsys.readouterr().err
    assert main(["data", "export-real", "--env", "tau2", "--split", "train", "--domain",
                 "telecom_full", "--out", str(tmp_path / "c.jsonl")]) == 2
    assert "no splits" in capsys.readouterr().err
    assert main(["data", "export-real", "--env", "tau2", "--split", "dev", "--domain", "moon",
                 "--out", str(tmp_path / "d.jsonl")]) == 2
    assert "unknown τ² domain" in capsys.readouterr().err
    assert not (tmp_path / "d.jsonl").exists()


def test_memory_accepts_only_tau2_train_tasks():
    from audit.worlds.memory import split_violations
    from envace.core.envs.tau2.tasks import split_ids

    train, dev = split_ids("train")[0], split_ids("dev")[0]
    assert split_violations([("tau2", train)]) == []
    assert split_violations([("tau2", dev)]) == [f"{dev} (not in the tau2 train split)"]


def test_training_report_unit_is_task_for_single_turn_families():
    from envace.training.config import TrainConfig
    from envace.training.train_report import _unit

    assert _unit(TrainConfig(env="tau2", task_unit="turn")) == "task"
    assert _unit(TrainConfig(env="bfcl", task_unit="turn")) == "turn"


def test_split_readme_sections_are_replaced_one_at_a_time(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("make_splits", ROOT / "scripts/make_splits.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "OUT", tmp_path)
    mod._write_readme("# Task splits\n\nbfcl 1", None)
    mod._write_readme(mod.TAU2_HEADING + "\n\ntau2 1", mod.TAU2_HEADING)
    mod._write_readme(mod.AGENTDOJO_HEADING + "\n\nad 1", mod.AGENTDOJO_HEADING)
    mod._write_readme(mod.TAU2_HEADING + "\n\ntau2 2", mod.TAU2_HEADING)
    mod._write_readme("# Task splits\n\nbfcl 2", None)
    text = (tmp_path / "README.md").read_text()
    assert text == ("# Task splits\n\nbfcl 2\n\n" + mod.AGENTDOJO_HEADING + "\n\nad 1\n\n"
                    + mod.TAU2_HEADING + "\n\ntau2 2\n")
