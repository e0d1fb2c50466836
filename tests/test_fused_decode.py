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


KINDS = ["llama", "llama-yarn", "qwen2", "qwen3"]


def _random_model(kind: str, seed: int = 0) -> torch.nn.Module:
    """A small randomly initialised decoder of one family (pure shapes, no training), with the
    features a wrong fused step would drop showing in its logits: head_dim unlike hidden/heads,
    biases on every projection that has one, an untied head, a scaled rotary, norm weights
    away from 1 (at 1 an RMSNorm commutes with the rotation)."""
    from transformers import (
        AutoModelForCausalLM,
        GPT2Config,
        LlamaConfig,
        Qwen2Config,
        Qwen3Config,
    )

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 16}
    configs = {
        "llama": lambda: LlamaConfig(**common, head_dim=24, attention_bias=True,
                                     mlp_bias=True, tie_word_embeddings=False),
        "llama-yarn": lambda: LlamaConfig(**common, head_dim=16, rope_parameters=yarn,
                                          tie_word_embeddings=True),
        "qwen2": lambda: Qwen2Config(**common, head_dim=24, tie_word_embeddings=False),
        "qwen3": lambda: Qwen3Config(**common, head_dim=24, attention_bias=True,
                                     tie_word_embeddings=True),  # q_norm, k_norm
        "qwen2-window": lambda: Qwen2Config(**common, use_sliding_window=True,
                                            sliding_window=8, max_window_layers=0),
        "gpt2": lambda: GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4),
    }
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(configs[kind]())
    with torch.no_grad():  # biases are zero and norms one at init: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
            elif "norm" in name:
                p.normal_(1, 0.3)
    return model.eval()


@pytest.mark.parametrize("kind", KINDS)
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
         fused: bool, packed: bool, below: float) -> tuple[list[torch.Tensor], list, int]:
    s = HFStepper(model, 0, fused=fused, packed=packed, compact_below=below)
    out = [s.prefill(prompts)]
    for chunks in plan:
        out.append(s.extend(chunks))
    assert (s.fused_steps > 0) == (fused and any(max(map(len, c)) == 1 for c in plan))
    kv = [(layer.keys.clone(), layer.values.clone()) for layer in s.cache.layers]
    return out, kv, s.compactions


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fused_steps_give_the_models_logits_and_cache(kind, data, monkeypatch):
    """Fused and unfused steppers fed the same prompts, one-token steps (some rows waiting)
    and forced chunks give the same logits and the same cache, with the cache compacted or
    not and the stacked q/k/v and gate/up products packed for oneDNN or not."""
    import envace.model.backends.hf as hf
    import envace.model.backends.packed_linear as pl

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
    below = data.draw(st.sampled_from([0.0, 0.75, 1.0]))
    with monkeypatch.context() as m:
        m.setattr(hf, "COMPACT_MIN_WIDTH", 1)  # small test caches compact too
        if data.draw(st.booleans()):
            m.setattr(pl, "MIN_ELEMENTS", 0)  # every layer and stack on the packed kernel
        ref, ref_kv, ref_compactions = _run(model, prompts, plan, False, packed, below)
        got, got_kv, compactions = _run(model, prompts, plan, True, packed, below)
    assert compactions == ref_compactions
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, atol=2e-5, rtol=1e-4)
    for (rk, rv), (gk, gv) in zip(ref_kv, got_kv, strict=True):
        torch.testing.assert_close(gk, rk, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(gv, rv, atol=2e-5, rtol=1e-4)


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


@pytest.mark.parametrize("which", ["weight", "bias"])
def test_a_weight_or_bias_changed_in_place_is_stacked_again(which):
    """The stacked q/k/v and gate/up copies follow the parameters: after an in-place change the
    fused step gives the changed model's logits, not the stale copy's."""
    model = _random_model("qwen2")  # q/k/v biases
    fused, plain = (HFStepper(model, 0, fused=f, packed=True) for f in (True, False))
    for s in (fused, plain):
        s.prefill([[1, 2, 3, 4], [5, 6]])
        s.step([7, 8], [True, True])
    before = fused.fused._cat
    with torch.no_grad():
        if which == "weight":
            model.model.layers[1].mlp.up_proj.weight.mul_(1.5)
            model.model.layers[0].self_attn.k_proj.weight.add_(0.1)
        else:
            model.model.layers[0].self_attn.k_proj.bias.add_(1.0)
    got, want = (s.step([9, 10], [True, True]) for s in (fused, plain))
    assert fused.fused._cat is not before
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_a_hooked_or_adapted_model_takes_its_own_forward():
    """The fused step never calls the layer, attention or MLP modules: a model with a hook or a
    projection that is not a plain nn.Linear (an adapter's subclass) is not fused."""
    class Adapted(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    model = _random_model("llama")
    handle = model.model.layers[1].mlp.register_forward_hook(lambda m, i, o: o * 0)
    assert not fusable(model)
    handle.remove()
    assert fusable(model)
    old = model.model.layers[1].self_attn.v_proj
    model.model.layers[1].self_attn.v_proj = Adapted(old.in_features, old.out_features)
    assert not fusable(model)
    model.model.layers[1].self_attn.v_proj = old
    model.model.layers[1].mlp.forward = lambda x: x  # an instance-level forward
    assert not fusable(model)
