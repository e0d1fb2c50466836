"""Who answers a rehearsed plan's calls (`RehearsalSettings.world`): the policy, the hybrid
(the train split's lookup where it has the exact call), or the oracle (a private copy of the real
environment per plan). The engine's own logic runs on scripted text (`_gen`); the end-to-end
checks run the committed tiny model against the real BFCL backends."""

from __future__ import annotations

import json

import pytest

from audit.worlds.memory import scenario_key
from envace.core.envs.bfcl.env import BFCLEnv
from envace.core.envs.bfcl.tasks import get_task
from envace.model import chat
from envace.model.models import load_model
from envace.model.rehearsal import (
    WORLDS,
    RehearsalSettings,
    executed_calls,
    rehearse_and_commit,
)
from envace.model.rollout import CONTEXT, REHEARSE, Engine, RolloutConfig
from tests.conftest import ROOT, play

MODEL = ROOT / "data" / "models" / "tiny-sft"
TASKS = ["multi_turn_base_2", "multi_turn_base_7", "multi_turn_base_31"]


@pytest.fixture(scope="module")
def trained():
    return load_model(MODEL)


def _known_call(memory, task_id):
    """A (tool, arguments, answer) that another scenario made: the lookup answers it."""
    own = scenario_key(task_id)
    for e in memory.entries:
        if scenario_key(e.task_id) != own and e.arguments:
            return e.tool, e.arguments, memory.exact(e.tool, e.arguments, task_id)
    raise AssertionError("no call of another scenario in the memory")


def test_the_hybrid_forces_the_lookups_answer_and_lets_the_policy_write_the_rest(trained,
                                                                                   train_memory):
    model, tok = trained
    task = get_task("multi_turn_base_0")
    tool, args, answer = _known_call(train_memory, task.id)
    assert answer is not None
    eng = Engine(model, tok, RolloutConfig(mode="rehearse", lookup=train_memory))
    row = eng.start(task)
    play(eng, row, chat.format_call(tool, args), "act")
    msg = row.messages[-1]
    assert msg == {"role": "tool", "tool_call_id": "c0", "name": tool, "content": answer,
                   "rehearsed": True, "lookup": True}
    forced = [t for t, _, _ in row.queue]
    assert answer in tok.decode(forced)  # forced in, never sampled or trained
    assert {r for _, r, _ in row.queue} == {CONTEXT}
    assert row.gen == "act" and not row.pending  # the policy acts next, nothing to rehearse
    # a call nobody else made: the policy rehearses it (REHEARSE tokens), no lookup flag
    odd = {"folder": "no-training-call-has-this-folder"}
    assert train_memory.exact("cd", odd, task.id) is None
    row = eng.start(task)
    play(eng, row, chat.format_call("cd", odd), "act")
    assert row.gen == "rehearse" and not any(m.get("lookup") for m in row.messages)
    play(eng, row, '{"current_working_directory": "x"}', "rehearse")
    tool_msg = row.messages[-1]
    assert tool_msg["rehearsed"] is True and "lookup" not in tool_msg
    # the recorded trajectory keeps the flag (the spec's extra fields survive a round trip)
    row = eng.start(task)
    play(eng, row, chat.format_call(tool, args), "act")
    dumped = eng.episode(row, len(row.ids)).trajectory.dump()
    tools = [m for m in dumped["messages"] if m["role"] == "tool"]
    assert tools and tools[0]["lookup"] is True and tools[0]["rehearsed"] is True


def test_the_hybrid_never_answers_from_the_tasks_own_scenario(trained, train_memory):
    model, tok = trained
    task = get_task("multi_turn_base_0")
    own = [e for e in train_memory.entries if scenario_key(e.task_id) == scenario_key(task.id)]
    only_own = [e for e in own if train_memory.exact(e.tool, e.arguments, task.id) is None]
    assert only_own, "every call of this scenario was also made elsewhere"
    e = only_own[0]
    eng = Engine(model, tok, RolloutConfig(mode="rehearse", lookup=train_memory))
    row = eng.start(task)
    play(eng, row, chat.format_call(e.tool, e.arguments), "act")
    assert row.gen == "rehearse"  # the policy writes it: its own scenario's answer is hidden


def test_settings_refuse_a_world_they_cannot_run():
    assert WORLDS == ("self", "hybrid", "ranker", "oracle")
    with pytest.raises(ValueError, match="world"):
        RehearsalSettings(world="dream")
    with pytest.raises(ValueError, match="lookup"):
        RehearsalSettings(world="hybrid")  # no lookup to answer with
    with pytest.raises(ValueError, match="lookup"):
        RehearsalSettings(world="ranker")  # no ranker to answer with
    with pytest.raises(ValueError, match="lookup"):
        RehearsalSettings(world="self", lookup=object())


def test_the_ranker_world_answers_from_the_conversation(trained, train_memory):
    """`--world ranker`: the learned ranker (fitted on the real train split) answers a plan's
    call, forced in like the hybrid's answer, with what it picks for this conversation."""
    from audit.worlds.ranker import fit_ranker
    from envace.core.envs.bfcl.tasks import split_tasks
    from envace.core.export import export_real

    ranker = fit_ranker(train_memory, export_real(split_tasks("train")))
    model, tok = trained
    task = get_task("multi_turn_base_0")
    eng = Engine(model, tok, RolloutConfig(mode="rehearse", lookup=ranker))
    row = eng.start(task)
    odd = {"folder": "no-training-call-has-this-folder"}
    play(eng, row, chat.format_call("cd", odd), "act")
    msg = row.messages[-1]
    want = ranker.exact("cd", odd, task.id, row.messages[:-1])
    assert want is not None and msg["content"] == want
    assert msg["rehearsed"] is True and msg["lookup"] is True
    assert row.gen == "act" and {r for _, r, _ in row.queue} == {CONTEXT}
    settings = RehearsalSettings(strategy="parallel", n=1, world="ranker", lookup=ranker)
    assert settings.plan_mode == "rehearse"


def test_oracle_plans_run_in_private_copies_and_the_commit_in_its_own(trained):
    """Every plan response is real (the plans ran in fresh copies of the environment), the
    budget counts those calls apart from the commit's, and the commit's calls are its own."""
    model, tok = trained
    tasks = [get_task(t) for t in TASKS]
    before = BFCLEnv.executed_total
    res = rehearse_and_commit(model, tok, tasks, RehearsalSettings(  # limits off: the backend
        strategy="parallel", n=2, max_new_tokens=64, max_turns=4, world="oracle",  # runs (and
        call_timeout_s=None, call_memory_mb=None))  # is counted) in this process
    plan_calls = commit_calls = 0
    for r in res:
        for p in r["plans"]:
            assert p.trajectory.source == "real"  # executed, not imagined
            assert all(not st.response.rehearsed for st in p.trajectory.tool_steps()
                       if st.response is not None)
            assert p.tokens(REHEARSE) == 0
        assert r["budget"]["sandbox_env_calls"] == sum(executed_calls(p) for p in r["plans"])
        assert r["budget"]["real_env_calls"] == executed_calls(r["commit"])
        plan_calls += r["budget"]["sandbox_env_calls"]
        commit_calls += r["budget"]["real_env_calls"]
    assert plan_calls > 0, "the tiny model made no call in any plan"
    assert BFCLEnv.executed_total - before == plan_calls + commit_calls


def test_a_plans_writes_stay_in_its_own_copy(trained):
    """What an oracle plan relies on: two episodes of one task each get a fresh environment,
    so a directory one makes is not there for the other (scripted calls, real backend)."""
    model, tok = trained
    task = get_task("multi_turn_base_0")
    eng = Engine(model, tok, RolloutConfig(mode="real"))
    a, b = eng.start(task), eng.start(task)
    play(eng, a, chat.format_call("mkdir", {"dir_name": "made_by_plan"}), "act")
    play(eng, a, chat.format_call("ls", {}), "act")
    play(eng, b, chat.format_call("ls", {}), "act")
    seen_a, seen_b = a.messages[-1]["content"], b.messages[-1]["content"]
    assert a.messages[-1]["rehearsed"] is False and b.messages[-1]["rehearsed"] is False
    assert "made_by_plan" in seen_a and "made_by_plan" not in seen_b


def test_the_sweep_keeps_earlier_keys_for_the_policys_own_rehearsal():
    from experiments.rehearsal_sweep import setting_key
    from experiments.sweep_markdown import row

    assert setting_key("base", "parallel", 2) == "base/parallel/2"
    assert setting_key("base", "none", 0, "oracle") == "base/none/0"
    assert setting_key("base", "sequential", 3, "hybrid") == "base/sequential/3/hybrid"
    r = {"success_rate": 0.1, "success_ci": [0.0, 0.3], "reward_mean": 0.2,
         "reward_diff_vs_none": {"mean": 0.05, "ci": [0.01, 0.09]},
         "budget": {"rehearsal_tokens": 10}, "rehearsal_audit": None}
    line = row("base/sequential/3/oracle", json.loads(json.dumps(r)))
    assert line.startswith("| base | sequential, oracle | 3 |") and "**+0.050" in line


def test_eval_refuses_a_world_without_rehearsal(capsys, tmp_path):
    from envace import cli

    out = tmp_path / "never"
    rc = cli.main(["eval", "--model", str(MODEL), "--world", "oracle", "--rehearsal", "none",
                   "--out", str(out)])
    assert rc == 2 and "--world oracle answers rehearsed plans" in capsys.readouterr().err
    assert not out.exists()


def test_settings_refuse_a_plan_count_below_one():
    """n is checked with the other settings (a review had left the check unreachable)."""
    for strategy in ("parallel", "sequential"):
        with pytest.raises(ValueError, match="n must be"):
            RehearsalSettings(strategy=strategy, n=0)
    with pytest.raises(ValueError, match="n must be"):
        RehearsalSettings(strategy="none", n=-1)
    assert RehearsalSettings(strategy="none", n=0).plan_mode == "rehearse"
    assert RehearsalSettings(world="oracle", n=1).plan_mode == "real"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a GPU")
def test_eval_refuses_cuda_without_a_gpu(capsys, tmp_path):
    from envace import cli

    out = tmp_path / "never"
    rc = cli.main(["eval", "--model", str(MODEL), "--device", "cuda", "--out", str(out)])
    assert rc == 2 and "torch sees no GPU" in capsys.readouterr().err
    assert not out.exists()
