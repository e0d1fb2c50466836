"""AgentDojo through rollout, train and eval: the environment is a property of the task.

The real agentdojo backend and the committed tiny SFT policy (data/models/tiny-sft). The policy
was cold-started on BFCL, so its own AgentDojo calls are mostly unknown tools: the engine-level
tests drive it with the task's ground-truth calls to reach the real backend on every step.
The served simulator of a training config is checked against the stdlib fake OpenAI server of
tests/model/test_endpoint.py (pure logic; the real vLLM server tests are in tests/vllm/).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from audit.replay import replay_trajectory
from audit.scoring.settings import AuditOptions
from envace.core.envs.agentdojo.tasks import get_task, split_ids
from envace.core.envs.bfcl.tasks import get_task as bfcl_task
from envace.core.envs.task_envs import check_task_env, env_record, env_tasks, task_environment
from envace.core.rewards import REWARDS, task_reward
from envace.model import chat
from envace.model.models import load_model
from envace.model.rollout import Engine, RolloutConfig
from tests.conftest import play
from tests.model.test_endpoint import ANSWER, FakeOpenAI, _handler

ROOT = Path(__file__).resolve().parents[2]
TINY_SFT = ROOT / "data" / "models" / "tiny-sft"
ENVACE = [sys.executable, "-m", "envace.cli"]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(args, capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def tiny():
    return load_model(TINY_SFT)


@pytest.fixture
def fake_server() -> Iterator[tuple[str, FakeOpenAI]]:
    """The fake OpenAI server of tests/model/test_endpoint.py (stdlib, pure logic)."""
    state = FakeOpenAI()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", state
    finally:
        httpd.shutdown()
        httpd.server_close()


# -- tasks and environments ------------------------------------------------------------------

def test_tasks_come_from_the_named_environment():
    dev = env_tasks("agentdojo", "dev")
    assert [t.id for t in dev] == split_ids("dev")
    # AgentDojo user tasks are single-turn: they are their own unit
    assert [t.id for t in env_tasks("agentdojo", "dev", unit="turn")] == [t.id for t in dev]
    assert all(t.env_name == "agentdojo" and len(t.turns) == 1 for t in dev)
    bfcl = env_tasks("bfcl", "dev", unit="turn")
    assert all("@t" in t.id and t.env_name == "bfcl" for t in bfcl)
    assert env_record(bfcl[0]) == {"name": "bfcl", "task": bfcl[0].base_id}
    assert env_record(dev[0]) == {"name": "agentdojo", "task": dev[0].id, "version": "v1.2.2"}
    env = task_environment(dev[0])
    assert env.name == "agentdojo" and env.suite == dev[0].suite
    with pytest.raises(ValueError, match="unknown environment 'nope'; installed: bfcl, agentdojo"):
        check_task_env("nope")
    with pytest.raises(ValueError, match="unknown split"):
        env_tasks("agentdojo", "holdout")


def test_rewards_dispatch_to_agentdojos_checker_and_ground_truth():
    task = get_task("banking/user_task_1")  # a question: the checker reads the answer text
    truth = [task.calls()]
    right = {k: task_reward(k, task, truth, task.ground_truth_output) for k in REWARDS}
    assert all(r["success"] and r["reward"] == 1.0 for r in right.values()), right
    silent = task_reward("state", task, truth, "")  # right calls, no answer: the task fails
    assert not silent["success"] and silent["reward"] == 0.0
    # the action rewards compare the calls with the task's ground truth, not the answer
    assert task_reward("action", task, truth, "")["reward"] == 1.0
    name, args = truth[0][0]
    wrong = [[(name, {k: "x" for k in args})]] if args else [[("get_iban", {})]]
    assert 0 < task_reward("action_partial", task, wrong, "")["reward"] < 1
    assert task_reward("action", task, [[]], "")["reward"] == 0.0


def test_bfcl_rewards_are_unchanged_by_an_answer_text():
    task = bfcl_task("multi_turn_base_0")
    from envace.core.envs.bfcl.env import BFCLEnv
    from envace.core.envs.bfcl.verify import ground_truth_calls

    env = BFCLEnv()
    env.reset(task)
    truth = ground_truth_calls(task, env)
    for kind in REWARDS:
        assert task_reward(kind, task, truth) == task_reward(kind, task, truth, "anything")
        assert task_reward(kind, task, truth)["reward"] == 1.0


# -- the rollout engine ------------------------------------------------------------------------

def test_real_episode_on_the_ground_truth_replays_without_divergence(tiny):
    """The engine answers each call from a real AgentDojo backend; the trajectory names it, its
    steps replay with zero divergence, and the verdict is the task's own checker's."""
    model, tok = tiny
    task = get_task("travel/user_task_3")
    eng = Engine(model, tok, RolloutConfig(mode="real", max_turns=30))
    row = eng.start(task)
    for name, args in task.calls():
        play(eng, row, chat.format_call(name, args))
        assert row.messages[-1]["role"] == "tool" and not row.messages[-1]["rehearsed"]
    play(eng, row, task.ground_truth_output)
    assert row.done == "finished"
    ep = eng.episode(row, 0)
    traj = ep.trajectory
    assert traj.env == {"name": "agentdojo", "task": task.id, "version": "v1.2.2"}
    assert traj.tools == task.tools()
    audit = replay_trajectory(traj, AuditOptions())
    real = [s for s in audit.steps if s["source_rehearsed"] is False]
    assert len(real) == len(audit.steps) == len(task.calls()) > 0
    assert not any(s["diverged"] for s in real) and not audit.warnings
    assert ep.final_text == task.ground_truth_output
    r = task_reward("state", ep.task, ep.calls_per_turn, ep.final_text)
    assert r["success"] and r["reward"] == 1.0


def test_rollout_cli_on_agentdojo_writes_trajectories_that_replay(tmp_path):
    out = tmp_path / "real.jsonl"
    r = _run(*ENVACE, "rollout", "--model", str(TINY_SFT), "--env", "agentdojo", "--split",
             "dev", "--tasks", "2", "--mode", "real", "--max-new-tokens", "48", "--out", str(out))
    assert r.returncode == 0, r.stderr[-1500:]
    trajs = [json.loads(x) for x in out.read_text().splitlines()]
    dev = set(split_ids("dev"))
    assert len(trajs) == 2 and all(t["task_id"] in dev for t in trajs)
    for t in trajs:
        assert t["env"] == {"name": "agentdojo", "task": t["task_id"], "version": "v1.2.2"}
        assert t["tools"] == get_task(t["task_id"]).tools()
        assert t["messages"][0]["content"] == get_task(t["task_id"]).prompt
    r = _run(sys.executable, "-m", "audit.cli", "--quiet", "replay", str(out), "--out",
             str(tmp_path / "audit"))
    assert r.returncode == 0, r.stderr[-1500:]
    s = json.loads((tmp_path / "audit" / "summary.json").read_text())
    assert s["counts"]["trajectories"] == 2 and s["counts"]["skipped"] == 0
    assert s["counts"]["diverged"] == 0
    r = _run(*ENVACE, "rollout", "--model", str(TINY_SFT), "--env", "nope", "--out",
             str(tmp_path / "x.jsonl"))
    assert r.returncode == 2 and "unknown environment 'nope'" in r.stderr


# -- train and eval ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ad_root(tmp_path_factory) -> Path:
    """A dashboard root made on AgentDojo: a tiny training run (``ad/``), the replay of three
    dev tasks' ground truth (``real_dev/``) and the same trajectories with one response
    rehearsed wrong (``sim_dev/``), their trajectory files in ``inputs/``."""
    from audit.pipeline import run_audit
    from audit.scoring.settings import AuditOptions
    from envace.core.export import export_env
    from envace.core.schema import TrajectoryWriter

    root = tmp_path_factory.mktemp("agentdojo_root")
    r = _run(*ENVACE, "train", "--config", str(ROOT / "configs" / "tiny.yaml"), "env=agentdojo",
             f"output_dir={root}", "run_name=ad", "steps=1", "prompts_per_step=2",
             "group_size=2", "eval_tasks=2", "max_new_tokens=12", "max_turns=2",
             "checkpoint_every=1", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    inputs = root / "inputs"  # inside the root: the dashboard reads conversations only there
    inputs.mkdir()
    real = list(export_env("agentdojo", split_ids("dev")[:3]))
    sim = [t.model_copy(deep=True) for t in real]
    tool = next(m for m in sim[0].messages if m.role == "tool")
    tool.content, tool.rehearsed = "- nothing found", True
    sim[0].id, sim[0].source = "sim-" + sim[0].id, "rehearsal"
    for name, trajs in (("real_dev", real), ("sim_dev", sim)):
        with TrajectoryWriter(inputs / f"{name}.jsonl", mode="w") as w:
            for t in trajs:
                w.write(t)
        run_audit([str(inputs / f"{name}.jsonl")], root / name, AuditOptions(progress=False))
    return root


def test_train_smoke_on_agentdojo(ad_root):
    run = ad_root / "ad"
    assert (run / "report.md").exists() and not (run / "RUNNING").exists()
    assert "(agentdojo)" in (run / "report.md").read_text()
    assert "env: agentdojo" in (run / "config.yaml").read_text()
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert row["step"] == 0 and "reward/mean" in row
    train = set(split_ids("train"))
    trajs = [json.loads(x) for x in (run / "rollouts" / "step_0.jsonl").read_text().splitlines()]
    assert len(trajs) == 4 and all(t["task_id"] in train for t in trajs)
    assert all(t["env"]["name"] == "agentdojo" for t in trajs)
    dev = set(split_ids("dev"))
    for sub in ("dev", "dev_rehearsed"):
        trajs = [json.loads(x) for x in
                 (run / "eval" / sub / "trajectories.jsonl").read_text().splitlines()]
        assert trajs and all(t["env"]["name"] == "agentdojo" and t["task_id"] in dev
                             for t in trajs)
    summary = json.loads((run / "eval" / "dev" / "summary.json").read_text())
    assert set(summary["by_backend"]) <= {"workspace", "travel", "banking", "slack"}
    audit = json.loads((run / "eval" / "dev_rehearsed" / "audit" / "summary.json").read_text())
    assert audit["counts"]["trajectories"] == 2 and audit["counts"]["skipped"] == 0


def test_eval_cli_on_agentdojo(tmp_path):
    out = tmp_path / "eval"
    r = _run(*ENVACE, "eval", "--model", str(TINY_SFT), "--env", "agentdojo", "--split", "dev",
             "--tasks", "2", "--max-new-tokens", "24", "--out", str(out))
    assert r.returncode == 0, r.stderr[-1500:]
    s = json.loads((out / "summary.json").read_text())
    assert s["attempts"] == 2 and set(s["by_backend"]) <= {"workspace", "travel", "banking",
                                                           "slack"}
    trajs = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert {t["env"]["name"] for t in trajs} == {"agentdojo"}
    assert {a["task"] for a in s["per_attempt"]} <= set(split_ids("dev"))


def test_config_env_key_is_checked_and_documented():
    from envace.training.config import ConfigError, TrainConfig, config_help

    assert TrainConfig().env == "bfcl" and TrainConfig().run_dir.name == "envace-tiny-s0"
    assert TrainConfig(env="agentdojo").run_dir.name == "envace-tiny-s0-agentdojo"
    with pytest.raises(ConfigError, match="env=bfcI: unknown environment 'bfcI'; installed: bfcl"):
        TrainConfig(env="bfcI")
    help_text = config_help(TrainConfig)
    assert "env (str, default 'bfcl')" in help_text and "agentdojo" in help_text
    assert "single user turn" in help_text  # task_unit on AgentDojo


# -- a served simulator in a training config ---------------------------------------------------

def test_training_config_builds_a_checked_endpoint_simulator(fake_server):
    from envace.training.config import ConfigError, TrainConfig
    from envace.training.train_setup import make_simulator

    url, state = fake_server
    for spec in (f"{url}#world", url):  # the served model by name, or the only one served
        sim = make_simulator(TrainConfig(mode="simulator", simulator_model=spec))
        assert sim.label == f"endpoint:{url}#world" and sim.client.api == "completions"
    task = get_task("banking/user_task_0")
    assert sim(task.opening_messages(), task.tools(), "get_iban", {}) == ANSWER
    assert state.requests[-1]["model"] == "world" and "prompt" in state.requests[-1]
    with pytest.raises(ConfigError, match="does not serve model 'other'"):
        make_simulator(TrainConfig(mode="simulator", simulator_model=f"{url}#other"))
    state.models = ["a", "b"]
    with pytest.raises(ConfigError, match="serves 2 models"):
        make_simulator(TrainConfig(mode="simulator", simulator_model=url))
    down = "http://127.0.0.1:9/v1#world"
    with pytest.raises(ConfigError, match="no usable OpenAI-compatible server"):
        make_simulator(TrainConfig(mode="simulator", simulator_model=down))


# -- the dashboard -----------------------------------------------------------------------------

PAGES = ["runs", "training", "fidelity", "trajectories", "compare", "rehearsal"]


def _open(monkeypatch, root: Path, page: str, run: str, **query: str):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("ENVACE_DASHBOARD_ROOT", str(root))
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    at.query_params["run"] = run
    at.query_params.update(query)
    at.run()
    if page != "runs":
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, (page, [e.value for e in at.exception])
    assert not at.error, (page, [e.value for e in at.error])
    return at


def _texts(at) -> str:
    return "\n".join(str(e.value) for kind in ("markdown", "caption", "info", "warning", "code")
                     for e in at.get(kind)).replace("\\", "").replace("\u2060", "")


@pytest.mark.parametrize("run", ["ad", "sim_dev"])
def test_dashboard_renders_agentdojo_runs_and_audits(monkeypatch, ad_root, run):
    for page in PAGES:
        _open(monkeypatch, ad_root, page, run)


def test_dashboard_trajectory_view_shows_agentdojo_tools_and_tasks(monkeypatch, ad_root):
    steps = [json.loads(x) for x in (ad_root / "sim_dev" / "steps.jsonl").read_text().splitlines()]
    wrong = next(s for s in steps if s["diverged"])
    at = _open(monkeypatch, ad_root, "trajectories", "sim_dev", traj=wrong["trajectory_id"])
    assert at.selectbox(key="tr_traj").value == wrong["trajectory_id"]
    body = _texts(at)
    assert wrong["task_id"] in body and wrong["tool"] in body
    assert "first divergence at **step 0**" in body
    assert "(real)" in at.selectbox(key="tr_ref").value  # aligned with the real_dev replay
    table = next(d.value for d in at.dataframe if "alignment" in d.value.columns)
    assert set(table["alignment"]) == {"same"}
    assert at.chat_message, "the conversation is shown"
