"""The rollout engine: KV-cache exactness, the act/rehearse/real state machine, limits."""

from __future__ import annotations

import pytest
import torch

from envace.core.envs.bfcl.tasks import get_task, split_tasks
from envace.core.envs.bfcl.turns import derive_turn_task
from envace.core.export import export_real
from envace.model import chat
from envace.model.backends.hf import HFStepper
from envace.model.models import build_tiny, load_model
from envace.model.rollout import ACT, CONTEXT, REHEARSE, Engine, RolloutConfig, run_episodes
from tests.conftest import play


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    texts = [chat.render([m.dump() for m in t.messages], t.tools)
             for t in export_real(split_tasks("train")[:40])]
    path = build_tiny(texts, tmp_path_factory.mktemp("tiny") / "m", seed=0)
    return load_model(path)


@pytest.mark.parametrize("path", ["default", "plain", "eager"])
def test_cached_logprobs_equal_a_full_forward(tiny, path, monkeypatch):
    """Lockstep decoding over one kept cache (left padding, masks, forced text in between)
    gives the same log-probabilities as encoding each finished sequence whole, on every decode
    path: the defaults; plain ``F.linear`` with no cache compaction; and every linear layer
    packed (``packed_linear``) with the cache compacted at every chance (``kv_cache.compact``)."""
    import envace.model.backends.hf as hf
    import envace.model.backends.kv_cache as kv
    import envace.model.backends.packed_linear as pl

    model, tok = tiny
    compactions = []
    if path == "plain":
        monkeypatch.setattr(hf, "COMPACT_BELOW", 0.0)
    if path == "eager":
        monkeypatch.setattr(pl, "MIN_ELEMENTS", 0)
        monkeypatch.setattr(hf, "COMPACT_BELOW", 1.0)
        monkeypatch.setattr(hf, "COMPACT_MIN_WIDTH", 1)
        real = kv.compact
        monkeypatch.setattr(kv, "compact", lambda c, m: compactions.append(1) or real(c, m))
    b1 = get_task("multi_turn_base_1")
    tasks = [derive_turn_task(get_task("multi_turn_base_0"), 1), b1,
             get_task("multi_turn_base_10"), b1, b1]
    eps = run_episodes(model, tok, tasks, RolloutConfig(mode="real", max_new_tokens=24,
                                                        max_turns=2, max_context=3000, seed=1,
                                                        packed_linear=path != "plain"))
    assert bool(compactions) == (path == "eager")
    # rows of different lengths were batched (finished rows left the batch early) and the three
    # rows of one prompt, encoded once, went their own ways
    assert len({len(e.ids) for e in eps}) > 1
    assert len({tuple(e.ids) for e in eps[1::2]}) > 1
    for e in eps:
        ids = torch.tensor([e.ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        full = logp.gather(-1, ids[0, 1:, None]).squeeze(-1)
        gen = [i for i, r in enumerate(e.roles) if r != CONTEXT]
        assert gen, "the policy generated nothing"
        got = torch.tensor([e.logprobs[i] for i in gen])
        want = full[torch.tensor(gen) - 1]
        assert torch.allclose(got, want, atol=2e-4), (got - want).abs().max()
        # context tokens carry no log-prob; the prompt is exactly the chat encoding
        assert all(e.logprobs[i] == 0.0 for i, r in enumerate(e.roles) if r == CONTEXT)


# the bf16 generation copy's tolerance against the fp32 model (docs/profiling.md): measured on
# the tiny model on these episodes, token-mean 0.0045 nats, max 0.05; the bounds leave room
BF16_MEAN_TOL, BF16_MAX_TOL = 0.02, 0.25


def test_bf16_rollout_logprobs_within_tolerance(tiny):
    """`gen_dtype="bfloat16"` decodes with a bf16 copy: its recorded log-probabilities equal a
    fresh forward of that copy (the cache path is exact up to bf16 rounding) and stay within the
    documented tolerance of the fp32 model's (what the update computes)."""
    from envace.model.backends.hf import generation_model

    model, tok = tiny
    b1 = get_task("multi_turn_base_1")
    tasks = [derive_turn_task(get_task("multi_turn_base_0"), 1), b1,
             get_task("multi_turn_base_10"), b1]
    cfg = RolloutConfig(mode="real", max_new_tokens=24, max_turns=2, max_context=3000, seed=1,
                        gen_dtype="bfloat16")
    eps = run_episodes(model, tok, tasks, cfg)
    copy = generation_model(model, "bfloat16")
    assert copy is not model and next(copy.parameters()).dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32  # the policy is untouched
    vs32, vs16 = [], []
    for e in eps:
        ids = torch.tensor([e.ids])
        gen = torch.tensor([i for i, r in enumerate(e.roles) if r != CONTEXT])
        got = torch.tensor([e.logprobs[i] for i in gen.tolist()])
        with torch.no_grad():
            for m, acc in ((model, vs32), (copy, vs16)):
                lp = torch.log_softmax(m(input_ids=ids).logits[0, :-1].float(), -1)
                acc.append((got - lp.gather(-1, ids[0, 1:, None])[:, 0][gen - 1]).abs())
    d32, d16 = torch.cat(vs32), torch.cat(vs16)
    assert len(d32) > 50
    assert float(d16.max()) < 0.05, float(d16.max())
    assert float(d32.mean()) < BF16_MEAN_TOL and float(d32.max()) < BF16_MAX_TOL
    assert float(d32.mean()) > 0  # bf16 really ran: an fp32 path would match to 2e-4


def test_bf16_copy_follows_the_weights(tiny):
    """The copy is kept while the weights stay, refreshed in place when they change (an
    optimizer step marks them: `mark_weights_changed`), and buffers keep their dtype."""
    import copy

    from envace.model.backends.hf import generation_model
    from envace.model.models import mark_weights_changed

    model = copy.deepcopy(tiny[0])  # a model of its own: the fixture's stays as it is
    first = generation_model(model, "bfloat16")
    assert generation_model(model, "bfloat16") is first
    assert generation_model(model, "same") is model
    assert all(b.dtype == b0.dtype for b, b0 in zip(first.buffers(), model.buffers(), strict=True))
    p = next(model.parameters())
    with torch.no_grad():
        p.data.add_(1.0)  # an in-place write that does not bump the version (like fused AdamW)
    mark_weights_changed(model)
    again = generation_model(model, "bfloat16")
    assert again is first  # refreshed in place, not rebuilt
    assert torch.allclose(next(again.parameters()).float(), p.detach().to(torch.bfloat16).float())
    with pytest.raises(ValueError, match="gen_dtype"):
        RolloutConfig(gen_dtype="float16")


def test_identical_prompts_are_encoded_once(tiny):
    """The stepper prefills each distinct prompt once; the copies give the same logits as
    encoding each row on its own, and dropping rows keeps the others' state."""
    model, tok = tiny

    def alone(ids):
        return HFStepper(model, 0).prefill([ids])[0]

    a, b = list(range(5, 40)), list(range(50, 70))
    st = HFStepper(model, 0)
    got = st.prefill([a, b, a, a])
    assert st.forward_tokens == len(a) + len(b)  # not 3 * len(a) + len(b)
    for row, ids in zip(got, [a, b, a, a], strict=True):
        assert torch.allclose(row, alone(ids), atol=1e-4)
    st.select([3, 1])
    got = st.extend([[7, 8], [9]])
    assert got.shape[0] == 2
    assert torch.allclose(got[0], alone(a + [7, 8]), atol=1e-4)
    assert torch.allclose(got[1], alone(b + [9]), atol=1e-4)


def test_untrained_policy_ends_cleanly_with_reasons(tiny):
    model, tok = tiny
    tasks = split_tasks("dev")[:3]
    eps = run_episodes(model, tok, tasks, RolloutConfig(mode="rehearse", max_new_tokens=16,
                                                        max_context=3000))
    assert [e.task.id for e in eps] == [t.id for t in tasks]
    for e in eps:
        assert e.end_reason in {"max_new_tokens", "finished", "malformed_call",
                                "context_limit", "max_turns"} or e.end_reason.startswith(
                                    "unknown_tool")
        assert e.trajectory.meta["end_reason"] == e.end_reason
        assert len(e.ids) == len(e.roles) == len(e.logprobs) == len(e.step_of_token)


def _engine(tiny, mode="rehearse"):
    model, tok = tiny
    return Engine(model, tok, RolloutConfig(mode=mode, max_turns=5))


def test_state_machine_rehearse_then_act_then_next_turn(tiny):
    eng = _engine(tiny)
    task = get_task("multi_turn_base_0")
    row = eng.start(task)
    call = chat.format_call("cd", {"folder": "document"})
    play(eng, row, call, "act")
    assert row.gen == "rehearse" and row.pending[0][1] == "cd"
    forced = eng.tok.decode([t for t, _, _ in row.queue])
    assert forced.endswith("<|im_start|>tool\n")
    play(eng, row, '{"current_working_directory": "document"}', "rehearse")
    tool = row.messages[-1]
    assert tool["role"] == "tool" and tool["rehearsed"] and tool["tool_call_id"] == "c0"
    assert row.gen == "act" and not row.pending
    play(eng, row, "", "act")  # no call: the user turn ends, the next one is forced in
    assert row.turn == 1 and row.done is None
    assert eng.tok.decode([t for t, _, _ in row.queue]).count(task.turns[1][0]["content"]) == 1
    assert row.calls_per_turn[0] == [("cd", {"folder": "document"})]


def test_state_machine_real_mode_forces_real_responses(tiny):
    eng = _engine(tiny, "real")
    row = eng.start(get_task("multi_turn_base_0"))
    play(eng, row, chat.format_call("cd", {"folder": "document"}), "act")
    tool = row.messages[-1]
    assert tool["rehearsed"] is False and "document" in tool["content"]
    roles = {r for _, r, _ in row.queue}
    assert roles == {CONTEXT} and row.gen == "act"


@pytest.mark.parametrize("text,reason", [
    ('<tool_call>{"name": "cd", "arguments": {', "malformed_call"),
    ("<tool_call>not json</tool_call>", "malformed_call"),
    ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "unknown_tool:rm_rf"),
])
def test_bad_calls_end_the_episode_and_are_recorded(tiny, text, reason):
    eng = _engine(tiny)
    row = eng.start(get_task("multi_turn_base_0"))
    play(eng, row, text, "act")
    assert row.done == reason
    ep = eng.episode(row, 0)
    steps = ep.trajectory.tool_steps()
    assert len(steps) == 1 and steps[0].response is None  # kept, unanswered
    if reason == "malformed_call":
        assert steps[0].malformed is not None


def test_max_turns_limit(tiny):
    model, tok = tiny
    eng = Engine(model, tok, RolloutConfig(mode="rehearse", max_turns=1))
    row = eng.start(get_task("multi_turn_base_0"))
    play(eng, row, "", "act")
    assert row.done == "max_turns"


def test_roles_of_a_rehearsed_episode_match_the_chat_encoding(tiny):
    """Token roles produced by the engine agree with encode_with_roles on the trajectory."""
    model, tok = tiny
    eps = run_episodes(model, tok, [get_task("multi_turn_base_1")],
                       RolloutConfig(mode="rehearse", max_new_tokens=12, max_context=3000))
    e = eps[0]
    ids, roles = chat.encode_with_roles(tok, [m.dump() for m in e.trajectory.messages],
                                        e.task.tools(turn=0), desc_chars=60)
    n = e.prompt_len
    assert e.ids[:n] == ids[:n] and set(e.roles[:n]) == {CONTEXT}
    assert set(e.roles[n:]) <= {CONTEXT, ACT, REHEARSE}


def test_call_ids_continue_after_the_history_of_a_per_turn_task(tiny):
    eng = _engine(tiny)
    task = derive_turn_task(get_task("multi_turn_base_0"), 2)
    row = eng.start(task)
    prior = [c["id"] for m in task.history for c in m.get("tool_calls") or []]
    play(eng, row, chat.format_call("ls", {}), "act")
    play(eng, row, "{}", "rehearse")
    ep = eng.episode(row, 0)
    ids = [s.call_id for s in ep.trajectory.tool_steps()]
    assert ids[: len(prior)] == prior and len(set(ids)) == len(ids)
    last = ep.trajectory.tool_steps()[-1]
    assert last.tool == "ls" and last.response.rehearsed and last.step == len(prior)


def test_rollout_cli_output_audits_cleanly(tmp_path):
    """`envace rollout` writes trajectories that `envace-audit replay` reads: real-mode
    responses replay with zero divergence (the environment is deterministic)."""
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    out = tmp_path / "real.jsonl"
    r = subprocess.run([sys.executable, "-m", "envace.cli", "rollout", "--model",
                        str(ROOT / "data" / "models" / "tiny-sft"), "--split", "dev", "--tasks",
                        "4", "--mode", "real", "--max-new-tokens", "48", "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-1500:]
    r = subprocess.run([sys.executable, "-m", "audit.cli", "--quiet", "replay", str(out),
                        "--out", str(tmp_path / "audit")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-1500:]
    s = json.loads((tmp_path / "audit" / "summary.json").read_text())
    assert s["counts"]["trajectories"] == 4
    assert s["by_source"]["real"]["diverged"] == 0


def test_a_per_turn_task_at_a_tools_added_turn_shows_the_new_tools_message(tiny):
    """A miss_func turn that restores withheld tools has no user text of its own: its per-turn
    task must open with the "new tools available" message (it used to show an empty request),
    offer the restored tools, and its episode records the message like a whole task does."""
    from envace.core.envs.bfcl.tasks import load_tasks

    base = next(t for t in load_tasks().values() if t.missed_functions)
    k, names = next(iter(sorted(base.missed_functions.items())))
    task = derive_turn_task(base, k)
    opening = task.opening_messages()
    new = [m for m in opening[len(task.history):] if m["role"] == "system"]
    assert [m["content"] for m in new] == ["New tools available: " + ", ".join(names) + "."]
    assert set(names) <= {s["function"]["name"] for s in task.tools(turn=0)}
    eng = _engine(tiny)
    row = eng.start(task)
    text = tiny[1].decode(row.ids)
    assert "New tools available: " + ", ".join(names) in text
    assert row.messages[len(task.history)]["content"].startswith("New tools available")
    # every per-turn task of the train split now shows the policy a request or the new tools
    from envace.core.envs.bfcl.tasks import split_tasks
    from envace.core.envs.bfcl.turns import turn_tasks

    empty = [t.id for t in turn_tasks(split_tasks("train"))
             if not any(m.get("content") for m in t.opening_messages()[len(t.history):])]
    assert empty == []
