"""Issue #39: a real-mode rollout's calls run under the call limit, C code included.

The policy commits BFCL's own ``square_root(number=2, precision=10**7)`` (127 s inside
``decimal``'s C code, where BFCL's alarm never fires) in a real-mode episode, as grpo, anchored
groups, ``envace eval`` and the oracle world run them: the call is cut at the limit, answered
with an error marked ``timeout``, and ends only its own episode; the other episodes of the batch
go on, the verifier does not run the stall again, and no environment process is left behind.
The message-level loop is driven by ``ScriptedBackend`` (a fake generation engine that writes
fixed messages: the engine, the environment and the guard are the real ones).
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from envace.core.envs.bfcl.tasks import get_task
from envace.core.rewards import task_reward
from envace.model import chat
from envace.model.backends.base import Generation, run_episodes_backend
from envace.model.rollout import Engine, RolloutConfig, close_rows
from tests.conftest import play

ROOT = Path(__file__).resolve().parents[2]
STALL = ("square_root", {"number": 2, "precision": 10**7})
LIMIT_S = 1.5


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ROOT / "data" / "models" / "tiny-sft")


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_a_c_level_stall_in_a_real_episode_is_cut_at_the_limit(tok):
    before = _children()
    eng = Engine(None, tok, RolloutConfig(mode="real", call_timeout_s=LIMIT_S))
    stalled = eng.start(get_task("multi_turn_base_32"))
    fine = eng.start(get_task("multi_turn_base_47"))
    t0 = time.monotonic()
    play(eng, stalled, chat.format_call(*STALL), "act")
    took = time.monotonic() - t0
    assert took < LIMIT_S + 8, took
    tool = stalled.messages[-1]
    assert tool["role"] == "tool" and tool["error"] and tool["timeout"] is True
    assert "call limit of 1.5 s" in tool["content"] and stalled.done == "call_timeout"
    assert stalled.calls_per_turn[0] == []  # the verifier will not run the stall again
    ep = eng.episode(stalled, 0)
    assert ep.end_reason == "call_timeout" and not any(ep.real_obs)
    assert ep.trajectory.tool_steps()[0].response.dump()["timeout"] is True
    # the other episode is untouched: its real calls answer
    play(eng, fine, chat.format_call("add", {"a": 2, "b": 3}), "act")
    assert fine.done is None and '"result": 5' in fine.messages[-1]["content"].replace(".0", "")
    close_rows([stalled, fine])
    time.sleep(0.2)
    assert _children() - before == set()


class ScriptedBackend:
    """A fake generation engine for this test: every request is answered with the next of a
    fixed list of messages (by the prompt's task), then with an empty message."""

    name = "scripted"

    def __init__(self, tok, scripts: dict[str, list[str]]) -> None:
        self.tok, self.scripts = tok, {k: list(v) for k, v in scripts.items()}
        self.im_end = chat.marker_id(tok, chat.IM_END)

    def generate(self, prompts, spec, max_new_tokens=None, seeds=None):
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            key = next(k for k in self.scripts if k in text)
            msg = self.scripts[key].pop(0) if self.scripts[key] else ""
            ids = chat.encode_text(self.tok, msg) + [self.im_end]
            out.append(Generation(ids, [0.0] * len(ids), True))
        return out

    def update_weights(self, state_dict) -> None:
        pass


def test_the_batch_goes_on_and_the_reward_does_not_stall_again(tok):
    """Two real episodes in one batch: one commits the stall, one an ordinary call."""
    tasks = [get_task("multi_turn_base_32"), get_task("multi_turn_base_47")]
    marks = [t.turns[0][0]["content"][:60] for t in tasks]
    scripts = {marks[0]: [chat.format_call(*STALL)],
               marks[1]: [chat.format_call("add", {"a": 2, "b": 3})]}
    before = _children()
    cfg = RolloutConfig(mode="real", max_turns=3, max_context=8192, call_timeout_s=LIMIT_S)
    t0 = time.monotonic()
    eps = run_episodes_backend(ScriptedBackend(tok, scripts), tok, tasks, cfg)
    assert time.monotonic() - t0 < LIMIT_S + 20
    assert eps[0].end_reason == "call_timeout"
    assert eps[1].end_reason != "call_timeout" and any(eps[1].real_obs)
    t0 = time.monotonic()
    reward = task_reward("state", tasks[0], eps[0].calls_per_turn, eps[0].final_text)
    assert time.monotonic() - t0 < 10 and reward["reward"] == 0.0
    time.sleep(0.2)
    assert _children() - before == set()  # every episode's process ended with the rollout


def test_a_response_past_the_size_limit_ends_its_episode_as_too_large(tok):
    from envace.core.schema import MAX_CALL_BYTES

    eng = Engine(None, tok, RolloutConfig(mode="real", call_timeout_s=10))
    row = eng.start(get_task("multi_turn_base_32"))
    try:
        big = "y" * (MAX_CALL_BYTES + 10)
        play(eng, row, chat.format_call("echo", {"content": big}), "act")
        tool = row.messages[-1]
        assert tool["too_large"] is True and tool["error"] and row.done == "call_too_large"
        assert f"{MAX_CALL_BYTES}-byte limit of a response" in tool["content"]
        assert len(tool["content"]) < 1000
    finally:
        close_rows([row])


def test_a_reset_past_the_limit_costs_its_episode_not_the_batch(tok, monkeypatch):
    from envace.core.envs.limits import CallTimeout
    from envace.model import rollout

    real = rollout.task_environment

    def stalls_on_32(task, limits):
        if task.id == "multi_turn_base_32":
            raise CallTimeout("bfcl.reset ran past the call limit of 1.5 s")
        return real(task, limits)

    monkeypatch.setattr(rollout, "task_environment", stalls_on_32)
    eng = Engine(None, tok, RolloutConfig(mode="real", call_timeout_s=LIMIT_S, max_context=8192))
    rows, _ = eng.start_all([get_task("multi_turn_base_32"), get_task("multi_turn_base_47")])
    assert rows[0].done == "reset_timeout" and rows[0].env is None
    assert rows[1].done is None and rows[1].env is not None
    close_rows(rows)
