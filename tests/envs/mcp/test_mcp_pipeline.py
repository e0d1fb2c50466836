"""MCP tasks through the rest of envace unchanged: the rollout engine in real mode, the verifier,
the audit of a rollout, ``envace eval``, the reference world models (``baseline``) and the
dashboard.

Uses the committed tiny model (data/models/tiny-sft) and the SDK-free ledger server; its task
file has train/dev/test splits (tests/envs/mcp/tasks/ledger.jsonl).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from envace.core.envs.family import family
from envace.core.rewards import task_reward
from envace.core.schema import TrajectoryWriter
from tests.conftest import play
from tests.envs.mcp.conftest import CONFIG, ROOT, TASKS

TINY = ROOT / "data" / "models" / "tiny-sft"
LEDGER_TASKS = TASKS / "ledger.jsonl"


@pytest.fixture(scope="module", autouse=True)
def _mcp_env():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ENVACE_MCP_CONFIG", str(CONFIG))
        mp.setenv("ENVACE_MCP_TASKS", str(LEDGER_TASKS))
        yield


@pytest.fixture(scope="module")
def tiny():
    from envace.model.models import load_model

    return load_model(TINY)


def test_rollout_engine_real_mode_verifier_and_audit_on_an_mcp_task(tiny, tmp_path):
    from envace.model import chat
    from envace.model.rollout import Engine, RolloutConfig

    model, tok = tiny
    task = family("mcp:ledger").get_task("groceries")
    eng = Engine(model, tok, RolloutConfig(mode="real", max_turns=5))
    row = eng.start(task)
    for name, args in task.calls():
        play(eng, row, chat.format_call(name, args), "act")
        assert row.messages[-1]["rehearsed"] is False
    assert row.messages[-1]["content"] == '{"account": "cash", "balance": 200}'
    play(eng, row, "Your cash balance is 200.", "act")
    ep = eng.episode(row, 0)
    assert ep.trajectory.env == {"name": "mcp:ledger", "state": task.state}
    assert task_reward("state", task, ep.calls_per_turn, ep.final_text)["reward"] == 1.0
    short = [ep.calls_per_turn[0][:1]]  # without the second write: another final state
    assert task_reward("state", task, short, "")["reward"] == 0.0
    assert 0 < task_reward("action", task, short, "")["reward"] < 1
    path = tmp_path / "rollout.jsonl"
    with TrajectoryWriter(path, mode="w") as w:
        w.write(ep.trajectory)
    s = run_audit([str(path)], tmp_path / "a", AuditOptions(progress=False, plots=False))
    assert s["counts"]["steps"] == 3 and s["counts"]["diverged"] == 0


def test_eval_and_baseline_commands_run_on_mcp_tasks(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ENVACE_MCP_CONFIG", None)
    env.pop("ENVACE_MCP_TASKS", None)  # the options on the command line, nothing inherited
    r = subprocess.run([sys.executable, "-m", "envace.cli", "eval", "--model", str(TINY),
                        "--env", "mcp:ledger", "--mcp-config", str(CONFIG), "--mcp-tasks",
                        str(LEDGER_TASKS), "--split", "dev", "--tasks", "0",
                        "--max-new-tokens", "32", "--device", "cpu", "--out",
                        str(tmp_path / "eval")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["tasks"] == 3 and summary["attempts"] == 3
    # the lookup reference world model, built from a recording, audited on it
    r = subprocess.run([sys.executable, "-m", "envace.cli", "data", "record", "--env",
                        "mcp:ledger", "--mcp-config", str(CONFIG), "--tasks", str(LEDGER_TASKS),
                        "--out", str(tmp_path / "real.jsonl")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "audit.cli", "--quiet", "baseline",
                        str(tmp_path / "real.jsonl"), "--reference", str(tmp_path / "real.jsonl"),
                        "--model", "lookup", "--mcp-config", str(CONFIG), "--out",
                        str(tmp_path / "base")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((tmp_path / "base" / "summary.json").read_text())
    assert s["counts"]["steps"] > 0 and s["counts"]["skipped"] == 0


def test_the_dashboard_shows_an_mcp_audit(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from envace.core.envs.mcp.record import record

    n, problems = record("mcp:ledger", str(LEDGER_TASKS), str(tmp_path / "real.jsonl"))
    assert n == 6 and not problems
    run_audit([str(tmp_path / "real.jsonl")], tmp_path / "root" / "mcp-audit",
              AuditOptions(progress=False, plots=False))
    monkeypatch.setenv("ENVACE_DASHBOARD_ROOT", str(tmp_path / "root"))
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    at.query_params["run"] = "mcp-audit"
    at.run()
    at.switch_page("views/fidelity.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("0 of 6 trajectories diverge" in str(m.value) for m in at.markdown)
