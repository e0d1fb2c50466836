"""The fused one-token decode step (``envace.model.backends.fused_decode``) against the model's
own forward: the same logits to float rounding over random prompts, chunks and waiting rows, for
each decoder family it takes (small random Llama, Qwen2 with biases, Qwen3 with q/k norms, and
the committed tiny model), and the families it refuses."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace.model.backends.fused_decode import FusedDecoder, fusable
from envace.model.backends.hf import HFStepper

VOCAB = 97


def _random_model(kind: str, seed: int = 0) -> torch.nn.Module:
    """A small randomly initialised decoder of one family (pure shapes, no training)."""
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=True)
    configs = {
        "llama": lambda: LlamaConfig(**common, head_dim=16),
        "qwen2": lambda: Qwen2Config(**common),  # q/k/v biases
        "qwen3": lambda: Qwen3Config(**common, head_dim=16),  # q_norm, k_norm
        "qwen2-window": lambda: Qwen2Config(**common, use_sliding_window=True,
                                            sliding_window=8, max_window_layers=0),
        "gpt2": lambda: GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4),
    }
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(configs[kind]())
    with torch.no_grad():  # biases are zero at init: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    return model.eval()


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_families_are_fusable(kind):
    assert fusable(_random_model(kind))


@pytest.mark.parametrize("kind", ["qwen2-window", "gpt2"])
def test_other_models_take_their_own_forward(kind):
    model = _random_model(kind)
    assert not fusable(model)
    with pytest.raises(ValueError, match="not a decoder"):
        FusedDecoder(model)
    s = HFStepper(model, 0)
    s.prefill([[1, 2, 3]])
    s.step([4], [True])
    assert s.fused is None and s.fused_steps == 0


def _run(model: torch.nn.Module, prompts: list[list[int]], plan: list[list[list[int]]],
         fused: bool, packed: bool) -> list[torch.Tensor]:
    s = HFStepper(model, 0, fused=fused, packed=packed, compact_below=0.75)
    out = [s.prefill(prompts)]
    for chunks in plan:
        out.append(s.extend(chunks))
    assert (s.fused_steps > 0) == (fused and any(max(map(len, c)) == 1 for c in plan))
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fused_steps_give_the_models_logits(kind, data):
    model = _random_model(kind)
    b = data.draw(st.integers(1, 4))
    token = st.integers(1, VOCAB - 1)
    prompts = [data.draw(st.lists(token, min_size=1, max_size=20)) for _ in range(b)]
    # mostly one-token steps (some rows waiting), now and then a forced chunk
    plan = []
    for _ in range(data.draw(st.integers(1, 12))):
        wide = data.draw(st.booleans()) and data.draw(st.booleans())
        rows = [data.draw(st.lists(token, min_size=0, max_size=6 if wide else 1))
                for _ in range(b)]
        if not any(rows):
            rows[0] = [data.draw(token)]
        plan.append(rows)
    packed = data.draw(st.booleans())
    ref = _run(model, prompts, plan, fused=False, packed=packed)
    got = _run(model, prompts, plan, fused=True, packed=packed)
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, atol=2e-5, rtol=1e-4)


def test_the_tiny_model_decodes_the_same_tokens_fused():
    from envace.model.models import load_model

    model, _ = load_model("data/models/tiny-sft")  # the committed cold start (Qwen3 shapes)
    assert fusable(model)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17]]
    seqs = {}
    for fused in (False, True):
        s = HFStepper(model, 0, fused=fused)
        logits = s.prefill(prompts)
        toks = []
        for _ in range(24):
            nxt = logits.argmax(-1).tolist()
            toks.append(nxt)
            logits = s.step(nxt, [True] * len(prompts))
        seqs[fused] = (toks, logits)
        assert (s.fused_steps == 24) == fused
    assert seqs[True][0] == seqs[False][0]
    torch.testing.assert_close(seqs[True][1], seqs[False][1], atol=1e-4, rtol=1e-4)


def test_a_weight_changed_in_place_is_joined_again():
    """The stacked q/k/v and gate/up copies follow the weights: after an in-place change the
    fused step gives the changed model's logits, not the stale copy's."""
    model = _random_model("llama")
    fused, plain = (HFStepper(model, 0, fused=f, packed=True) for f in (True, False))
    for s in (fused, plain):
        s.prefill([[1, 2, 3, 4], [5, 6]])
        s.step([7, 8], [True, True])
    before = fused.fused._cat
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.mul_(1.5)
        model.model.layers[0].self_attn.k_proj.weight.add_(0.1)
    got, want = (s.step([9, 10], [True, True]) for s in (fused, plain))
    assert fused.fused._cat is not before
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
