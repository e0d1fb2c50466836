"""The confidence gate (`envace.model.trust`, `RolloutConfig.rehearse_trust`): a rehearsal below
the threshold leaves the episode and the real environment answers instead. The pure-logic unit
tests are named as such; the rollouts run the committed tiny model on real BFCL backends."""

from __future__ import annotations

import math

import pytest
import torch

from envace.core.envs.bfcl.tasks import get_task
from envace.core.envs.limits import CallLimits
from envace.core.envs.task_envs import task_environment
from envace.model import chat
from envace.model.backends.base import HFBackend, run_episodes_backend
from envace.model.backends.hf import HFStepper
from envace.model.models import load_model
from envace.model.rollout import CONTEXT, REHEARSE, RolloutConfig, run_episodes
from envace.model.trust import check_trust, gate_counts, trusts
from tests.conftest import ROOT

MODEL = ROOT / "data" / "models" / "tiny-sft"
TASKS = ["multi_turn_base_2", "multi_turn_base_7", "multi_turn_base_31"]


@pytest.fixture(scope="module")
def trained():
    return load_model(MODEL)


def _episodes(trained, trust, seed=3):
    model, tok = trained
    cfg = RolloutConfig(mode="rehearse", temperature=1.0, max_turns=4, max_new_tokens=96,
                        seed=seed, rehearse_trust=trust)
    return run_episodes(model, tok, [get_task(t) for t in TASKS], cfg)


@pytest.mark.parametrize("bad", [0.1, math.nan, math.inf, -math.inf, "x", True])
def test_pure_logic_a_threshold_that_is_not_a_finite_log_probability_is_refused(bad):
    with pytest.raises(ValueError, match="trust threshold"):
        check_trust(bad)
    with pytest.raises(ValueError, match="trust threshold"):
        RolloutConfig(mode="rehearse", rehearse_trust=bad)


def test_pure_logic_trust_means_confidence_at_or_above_the_threshold():
    assert check_trust(None) is None and check_trust(0) == 0.0
    assert trusts(-2.0, 4, -0.5) and not trusts(-2.1, 4, -0.5)  # mean -0.5 vs -0.525
    assert trusts(0.0, 3, 0.0)  # every token had probability 1: trusted even at C = 0
    assert not trusts(None, 3, -1e9) and not trusts(-1.0, 0, -1e9)  # no figures: never trusted
    msgs = [{"role": "tool", "rehearsed": True}, {"role": "tool", "rehearsed": False},
            {"role": "tool", "rehearsed": False, "gated": True}, {"role": "assistant"},
            {"role": "tool", "rehearsed": True, "lookup": True}]
    assert gate_counts(msgs) == {"rehearsed": 2, "gated_real": 1}


def test_forgetting_tokens_leaves_the_cache_as_if_they_were_never_appended(trained):
    """Known answer: A, then B forgotten, then C gives the logits of A then C (another row in
    the batch goes on unaffected)."""
    model, tok = trained
    a = chat.encode_text(tok, "<|im_start|>user\nlist the files<|im_end|>\n")
    b = chat.encode_text(tok, "<|im_start|>tool\nsomething imagined and long")
    c = chat.encode_text(tok, "<|im_start|>tool\nreal")
    other = chat.encode_text(tok, "<|im_start|>user\nhello there")

    def run(chunks_after):
        s = HFStepper(model, tok.pad_token_id or 0)
        s.prefill([a, other])
        out = None
        for chunks, forget in chunks_after:
            out = s.extend(chunks)
            if forget:
                s.forget(0, forget)
        return out

    got = run([([b, [1, 2]], len(b)), ([c, [3]], 0)])
    want = run([([c, [1, 2]], 0)])
    assert torch.allclose(got[0], want[0], atol=1e-4), (got[0] - want[0]).abs().max()
    alone = HFStepper(model, tok.pad_token_id or 0)
    alone.prefill([other])
    assert torch.allclose(got[1], alone.extend([[1, 2, 3]])[0], atol=1e-4)


def test_gate_at_zero_sends_calls_to_reality_and_the_episode_is_the_one_it_says(trained):
    """C = 0: every rehearsal with a token below probability 1 is replaced by the real
    response. The episode's tokens are exactly the chat encoding of its messages (the discarded
    rehearsal left no token), every generated token's log-prob equals a full forward over them
    (the cache forgot it too), and a gated call's content is what a fresh real environment
    answers."""
    model, tok = trained
    eps = _episodes(trained, 0.0)
    gated = [m for e in eps for m in e.trajectory.messages if m.role == "tool" and
             getattr(m, "gated", None)]
    assert gated, "nothing was gated at C = 0"
    for m in gated:
        assert m.rehearsed is False and m.rehearsal_confidence < 0.0
    for e in eps:
        counts = gate_counts(e.trajectory.messages)
        tools = [m for m in e.trajectory.messages if m.role == "tool"]
        assert counts["rehearsed"] + counts["gated_real"] == len(tools)
        kept = [m for m in tools if m.rehearsed and not getattr(m, "truncated", False)]
        assert all(trusts(m.logprob, m.num_tokens, 0.0) for m in kept)
        # the discarded rehearsals' tokens are gone: the REHEARSE tokens are the kept ones'
        assert e.tokens(REHEARSE) == sum(m.num_tokens or 0 for m in kept) + sum(
            len(chat.encode_text(tok, m.content)) for m in tools
            if getattr(m, "truncated", False))
        text = tok.decode(e.ids)
        assert all(m.content in text for m in tools if getattr(m, "gated", None))
        gen = [i for i, r in enumerate(e.roles) if r != CONTEXT]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([e.ids])).logits[0, :-1]
                                     .float(), -1)
        full = logp.gather(-1, torch.tensor(e.ids)[1:, None]).squeeze(-1)
        got = torch.tensor([e.logprobs[i] for i in gen])
        assert torch.allclose(got, full[torch.tensor(gen) - 1], atol=2e-4)
    first = next(e for e in eps if any(getattr(m, "gated", None) for m in e.trajectory.messages))
    msgs = first.trajectory.messages
    k = next(i for i, m in enumerate(msgs) if getattr(m, "gated", None))
    assert not any(m.role == "tool" for m in msgs[:k])  # these tasks have no history
    call = next(c for c in msgs[k - 1].tool_calls if c.id == msgs[k].tool_call_id)
    env = task_environment(first.task, CallLimits(None, None))  # a fresh one agrees
    assert env.execute(call.function.name, call.function.arguments).content == msgs[k].content


def test_a_threshold_below_every_confidence_is_plain_rehearsal(trained):
    plain, low = _episodes(trained, None), _episodes(trained, -1e9)
    assert [e.ids for e in plain] == [e.ids for e in low]
    assert [e.trajectory.messages for e in plain] == [e.trajectory.messages for e in low]
    assert all(gate_counts(e.trajectory.messages)["gated_real"] == 0 for e in low)


def test_the_gate_works_on_a_message_level_backend(trained):
    """The backends that send each message's whole prompt (vLLM's, ``HFBackend``) need no cache
    to forget: the discarded rehearsal's tokens are out of the next prompt."""
    model, tok = trained
    cfg = RolloutConfig(mode="rehearse", temperature=1.0, max_turns=4, max_new_tokens=96, seed=3,
                        rehearse_trust=0.0)
    eps = run_episodes_backend(HFBackend(model, tok.pad_token_id or 0), tok,
                               [get_task(t) for t in TASKS], cfg)
    tools = [m for e in eps for m in e.trajectory.messages if m.role == "tool"]
    assert any(getattr(m, "gated", None) for m in tools)
    for e in eps:
        kept = [m for m in e.trajectory.messages if m.role == "tool" and m.rehearsed
                and not getattr(m, "truncated", False)]
        if not any(getattr(m, "truncated", False) for m in e.trajectory.messages):
            assert e.tokens(REHEARSE) == sum(m.num_tokens for m in kept)
