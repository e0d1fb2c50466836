"""Test-time rehearsal: the real environment is untouched while rehearsing, the commit makes
exactly its own calls, the memory stays within budget, bad plans still lead to a commit."""

from __future__ import annotations

import pytest

from envace.core.envs.bfcl.env import BFCLEnv
from envace.core.envs.bfcl.tasks import get_task
from envace.model import chat
from envace.model.models import load_model
from envace.model.rehearsal import (
    FOOTER,
    HEADER,
    RehearsalSettings,
    build_memory,
    plan_text,
    rehearse_and_commit,
)
from envace.model.rollout import Engine, RolloutConfig, run_episodes
from tests.conftest import ROOT

MODEL = ROOT / "data" / "models" / "tiny-sft"


@pytest.fixture(scope="module")
def trained():
    return load_model(MODEL)


TASKS = ["multi_turn_base_2", "multi_turn_base_7", "multi_turn_base_31"]


def test_rehearsal_touches_no_environment_and_commit_only_its_own(trained):
    model, tok = trained
    tasks = [get_task(t) for t in TASKS]
    before = BFCLEnv.executed_total
    eps = run_episodes(model, tok, tasks * 2, RolloutConfig(mode="rehearse", max_new_tokens=64,
                                                            max_turns=4, seed=3))
    assert BFCLEnv.executed_total == before, "rehearsal executed a real call"
    assert any(e.trajectory.tool_steps() for e in eps), "the trained model made no call"
    for strategy in ("parallel", "sequential"):
        before = BFCLEnv.executed_total
        res = rehearse_and_commit(model, tok, tasks, RehearsalSettings(  # limits off: the
            strategy=strategy, n=2, max_new_tokens=64, max_turns=4,  # backend runs (and is
            call_timeout_s=None, call_memory_mb=None))  # counted) in this process
        answered = [sum(1 for s in r["commit"].trajectory.tool_steps() if s.response is not None)
                    for r in res]
        assert BFCLEnv.executed_total - before == sum(answered)  # the commits' own, no more
        assert [r["budget"]["real_env_calls"] for r in res] == answered
        for r in res:
            assert len(r["plans"]) == 2 and r["memory"]["text"].startswith(HEADER)
            mem = [m for m in r["commit"].trajectory.messages if m.role == "system"]
            assert mem and mem[-1].content == r["memory"]["text"]
            assert all(t.source == "rehearsal" for t in (p.trajectory for p in r["plans"]))
            assert r["commit"].trajectory.source == "real"
        if strategy == "sequential":
            assert all(len(r["critiques"]) == 2 for r in res)


def test_memory_drops_oldest_plans_and_says_so(trained):
    _, tok = trained
    plans = [f"Plan {i}: " + "cd(folder=\"x\") -> {} ; " * 30 for i in range(1, 5)]
    full, dropped = build_memory(plans, [], tok, 10_000)
    assert dropped == 0 and full.endswith(FOOTER)
    text, dropped = build_memory(plans, [], tok, 400)
    assert dropped > 0 and f"({dropped} earlier plan(s) dropped" in text
    assert "Plan 4:" in text and "Plan 1:" not in text
    assert len(chat.encode_text(tok, text)) <= 400
    cut, _ = build_memory(["Plan 1: " + "y" * 5000], [], tok, 50)
    assert 0 < len(chat.encode_text(tok, cut)) <= 50


def test_a_malformed_plan_is_bounded_recorded_and_the_commit_happens(trained):
    model, tok = trained
    eng = Engine(model, tok, RolloutConfig(mode="rehearse"))
    row = eng.start(get_task("multi_turn_base_2"))
    row.gen, row.buf = "act", chat.encode_text(tok, "<tool_call>{oops") + [eng.im_end]
    eng.finish_message(row)
    ep = eng.episode(row, 0)
    assert "[ended: malformed_call]" in plan_text(ep, 1, 100)
    res = rehearse_and_commit(model, tok, [get_task("multi_turn_base_2")], RehearsalSettings(
        strategy="parallel", n=1, max_new_tokens=8, max_turns=1))  # plans cut short
    plan, commit = res[0]["plans"][0], res[0]["commit"]
    assert plan.end_reason.split(":")[0] in {"max_new_tokens", "max_turns", "malformed_call",
                                             "finished", "unknown_tool"}
    assert commit.trajectory.source == "real" and commit.end_reason  # the commit still ran
    assert commit.trajectory.messages[-1].role in ("assistant", "tool")


def test_the_memory_holds_only_what_the_policy_imagined(trained):
    """A per-turn task's earlier turns (real calls, real responses) stay in the conversation;
    the plan lists only the calls the policy made while rehearsing and the responses it wrote."""
    from envace.core.envs.bfcl.turns import derive_turn_task
    from envace.model.rehearsal import plan_of

    model, tok = trained
    task = derive_turn_task(get_task("multi_turn_base_0"), 2)
    history_calls = [c for m in task.history for c in m.get("tool_calls") or []]
    assert len(history_calls) >= 2
    eng = Engine(model, tok, RolloutConfig(mode="rehearse", max_turns=3))
    row = eng.start(task)
    for text, kind in ((chat.format_call("ls", {"a": True}), "act"),
                       ('{"current_directory_content": ["imagined.txt"]}', "rehearse")):
        row.gen, row.buf = kind, chat.encode_text(tok, text) + [eng.im_end]
        eng.finish_message(row)
    ep = eng.episode(row, 0)
    assert len(ep.trajectory.tool_steps()) == len(history_calls) + 1
    plan = plan_of(ep, 1)
    assert plan.calls == (('ls({"a": true})', '{"current_directory_content": ["imagined.txt"]}'),)
    text = plan_text(ep, 1, 160)
    real = [s.response.content for s in ep.trajectory.tool_steps()[:len(history_calls)]]
    assert all(r not in text for r in real if len(r) > 4)
    assert text.startswith("Plan 1: ls(")


def test_overflow_drops_old_plans_then_shortens_responses_never_the_newest_calls(trained):
    from hypothesis import example, given, settings
    from hypothesis import strategies as st

    from envace.model.rehearsal import Plan

    _, tok = trained

    def plan(i, n_calls, resp_len):
        return Plan(i, tuple((f'tool_{i}_{k}({{"k": {k}}})', "r" * resp_len)
                             for k in range(n_calls)))

    @settings(max_examples=40, deadline=None)
    @given(st.integers(1, 4), st.integers(1, 5), st.integers(0, 400), st.integers(60, 600))
    # found by the search on 2026-12-03: the calls fitted with nothing after the arrow, not with
    # "-> …" after each, and the memory was cut
    @example(n_plans=2, n_calls=4, resp_len=2, budget=139)
    def check(n_plans, n_calls, resp_len, budget):
        plans = [plan(i + 1, n_calls, resp_len) for i in range(n_plans)]
        crits = [f"critique {i}" for i in range(n_plans)]
        text, dropped = build_memory(plans, crits, tok, budget)
        assert len(chat.encode_text(tok, text)) <= budget
        newest = plans[-1]
        calls_alone = build_memory([Plan(newest.index, tuple((c, "") for c, _ in newest.calls))],
                                   [], tok, 10**6)[0]
        note = len(chat.encode_text(tok, f"({n_plans} earlier plan(s) dropped to fit the context)"))
        if len(chat.encode_text(tok, calls_alone)) + note + 2 <= budget:
            # every imagined call of the newest plan survives, whatever else had to go
            assert all(c in text for c, _ in newest.calls), text
            assert f"Plan {newest.index}:" in text
        if dropped and "(cut to fit the context)" not in text:
            # old plans go whole, oldest first, and the memory says so
            assert f"({dropped} earlier plan(s) dropped" in text
            assert all(f"Plan {p.index}:" not in text for p in plans[:dropped])

    check()
