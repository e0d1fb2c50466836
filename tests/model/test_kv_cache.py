"""The block-grown KV cache gives the logits of transformers' concatenating cache, whatever the
sequence of prefills, uneven chunks, waits and dropped rows (a property test on a tiny model)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

import envace.model.backends.kv_cache as kv
from envace.model.backends.hf import HFStepper
from envace.model.models import build_tiny, load_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    texts = ["<tool_call>{\"name\": \"ls\", \"arguments\": {}}</tool_call> ok " * 8] * 4
    model, _ = load_model(build_tiny(texts, tmp_path_factory.mktemp("t") / "m", seed=0))
    return model.eval()




def _run(model, ops, prompts, reference: bool, monkeypatch) -> list[torch.Tensor]:
    with monkeypatch.context() as m:
        if reference:
            m.setattr(kv, "block_cache", DynamicCache)
        s = HFStepper(model, 0)
        out = [s.prefill(prompts)]
        rows = len(prompts)
        for op in ops:
            if op[0] == "extend":
                chunks = [c for c in op[1]][:rows] + [[]] * max(0, rows - len(op[1]))
                if not any(chunks):
                    continue
                out.append(s.extend(chunks))
            elif rows > 1:
                keep = sorted({i % rows for i in op[1]})
                s.select(keep)
                rows = len(keep)
    return out


tokens = st.lists(st.integers(5, 60), min_size=0, max_size=40)
ops = st.lists(st.one_of(
    st.tuples(st.just("extend"), st.lists(tokens, min_size=1, max_size=4)),
    st.tuples(st.just("select"), st.lists(st.integers(0, 3), min_size=1, max_size=3))),
    min_size=1, max_size=12)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(st.lists(st.integers(5, 60), min_size=1, max_size=300), min_size=1,
                        max_size=4), ops=ops)
def test_block_cache_equals_the_concatenating_cache(tiny, monkeypatch, prompts, ops):
    got = _run(tiny, ops, prompts, False, monkeypatch)
    want = _run(tiny, ops, prompts, True, monkeypatch)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


def test_block_layer_grows_past_its_block_and_keeps_every_position(tiny):
    """A sequence longer than several blocks: the cache holds every position, in order, and
    the one-token logits equal a fresh forward of the whole sequence."""
    s = HFStepper(tiny, 0)
    seq = [(7 * i) % 50 + 5 for i in range(kv.BLOCK * 2 + 17)]
    s.prefill([seq[:10]])
    for t in seq[10:-1]:
        s.step([t], [True])
    last = s.step([seq[-1]], [True])
    layer = s.cache.layers[0]
    assert isinstance(layer, kv.BlockLayer)
    assert layer.get_seq_length() == len(seq) and layer.keys.shape[-2] == len(seq)
    with torch.no_grad():
        full = tiny(input_ids=torch.tensor([seq])).logits[0, -1].float()
    assert torch.allclose(last[0], full, atol=1e-4)


def _run_compact(model, ops, prompts, below: float) -> tuple[list[torch.Tensor], int]:
    s = HFStepper(model, 0, compact_below=below)
    out, rows = [s.prefill(prompts)], len(prompts)
    for op in ops:
        if op[0] == "extend":
            chunks = [c for c in op[1]][:rows] + [[]] * max(0, rows - len(op[1]))
            if any(chunks):
                out.append(s.extend(chunks))
        elif rows > 1:
            keep = sorted({i % rows for i in op[1]})
            s.select(keep)
            rows = len(keep)
    return out, s.compactions


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(st.lists(st.integers(5, 60), min_size=1, max_size=120), min_size=1,
                        max_size=4), ops=ops)
def test_compacting_the_cache_keeps_the_logits(tiny, monkeypatch, prompts, ops):
    """Dropping padding whenever there is any (the eagerest setting) gives the logits of a cache
    that never drops it, whatever the prefills, uneven chunks, waits and dropped rows."""
    import envace.model.backends.hf as hf

    monkeypatch.setattr(hf, "COMPACT_MIN_WIDTH", 1)
    got, n = _run_compact(tiny, ops, prompts, 1.0)
    want, none = _run_compact(tiny, ops, prompts, 0.0)
    assert none == 0
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


def test_compact_moves_real_positions_right_in_order():
    """Known answer: three rows with pads in different places."""
    cache = kv.block_cache()
    mask = torch.tensor([[0, 1, 0, 1, 1], [1, 1, 0, 0, 1], [0, 0, 0, 1, 0]])
    keys = torch.arange(3 * 5, dtype=torch.float).view(3, 1, 5, 1)
    cache.update(keys, -keys, 0)
    new = kv.compact(cache, mask)
    assert new.tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 1]]
    layer = cache.layers[0]
    assert layer.get_seq_length() == 3
    got = layer.keys[:, 0, :, 0]
    assert got[:2].tolist() == [[1, 3, 4], [5, 6, 9]] and got[2, -1] == 13  # the rest: pads
    assert torch.equal(layer.values, -layer.keys)
    layer.update(torch.ones(3, 1, 1, 1), torch.ones(3, 1, 1, 1))  # grows on from there
    assert layer.get_seq_length() == 4 and layer.keys[:, 0, -1, 0].tolist() == [1, 1, 1]
    assert kv.compact(cache, torch.ones(3, 4, dtype=torch.long)).shape == (3, 4)


def test_generate_with_finished_rows_compacts_only_when_it_pays(tiny, monkeypatch):
    """Finished rows keep a padding slot per step in ``HFBackend.generate``; when the longest
    row has finished, each step's compaction would only win one position: it must not rewrite
    the cache every step (what a real-share trigger did)."""
    from envace.model.backends.base import HFBackend, SamplingSpec

    calls = []
    real = kv.compact
    monkeypatch.setattr(kv, "compact",
                        lambda cache, mask: calls.append(mask.shape[1]) or real(cache, mask))
    prompts = [[5 + i % 50 for i in range(80)], [6, 7, 8], [9, 10, 11], [12, 13, 14]]
    spec = SamplingSpec(temperature=0.0, top_p=1.0, max_new_tokens=40)
    gens = HFBackend(tiny, 0).generate(prompts, spec, [1, 40, 40, 40])
    assert [len(g.ids) for g in gens] == [1, 40, 40, 40]
    assert len(calls) <= 2, calls


def test_a_sliding_window_model_is_never_compacted():
    """Its window counts cache slots, which compaction moves: the stepper leaves it alone."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from envace.model.backends.hf import windowed

    cfg = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    slid = Qwen3ForCausalLM(Qwen3Config(**cfg, use_sliding_window=True, sliding_window=8,
                                        max_window_layers=0)).eval()
    full = Qwen3ForCausalLM(Qwen3Config(**cfg)).eval()
    assert windowed(slid) and not windowed(full)
    assert HFStepper(slid, 0).compact_below == 0 and HFStepper(full, 0).compact_below > 0
