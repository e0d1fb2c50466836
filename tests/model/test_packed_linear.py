"""oneDNN-packed linear layers (``envace.model.backends.packed_linear``): the same product as
``F.linear`` to float rounding, never a stale weight, never on a path that needs gradients, and
the rollout engine decodes the same greedy tokens with and without them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import envace.model.backends.packed_linear as pl
from envace.model.backends.hf import HFStepper
from envace.model.backends.packed_linear import PackedLinears, available
from envace.model.models import build_tiny, load_model

pytestmark = pytest.mark.skipif(not available(), reason="this torch build has no oneDNN linear")


def _layer(n_in: int, n_out: int, bias: bool, seed: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(n_in, n_out, bias=bias)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), n_in=st.integers(1, 300), n_out=st.integers(1, 300),
       bias=st.booleans(), lead=st.sampled_from([(), (1,), (3,)]), seed=st.integers(0, 99))
def test_packed_forward_equals_f_linear_to_rounding(rows, n_in, n_out, bias, lead, seed):
    layer = _layer(n_in, n_out, bias, seed)
    x = torch.randn(rows, *lead, n_in)
    packs = PackedLinears(layer)
    with torch.no_grad():
        got, want = packs.forward(layer, x), F.linear(x, layer.weight, layer.bias)
    assert packs.packed_calls == 1
    assert got.shape == want.shape
    scale = 1 + x.abs().sum(-1, keepdim=True) * layer.weight.abs().max()
    assert ((got - want).abs() <= 1e-5 * scale).all()


def test_a_changed_weight_is_repacked():
    """An in-place write that bumps the version counter (``copy_``, ``add_``: a load, a bf16 copy
    refreshed) or new storage is seen at the next call: the output is the new weight's."""
    layer = _layer(64, 32, True, 0)
    packs = PackedLinears(layer)
    x = torch.randn(8, 64)
    with torch.no_grad():
        before = packs.forward(layer, x)
        layer.weight.add_(1.0)
        after = packs.forward(layer, x)
        assert torch.allclose(after, F.linear(x, layer.weight, layer.bias), atol=1e-4)
        assert not torch.allclose(before, after)
        layer.weight = torch.nn.Parameter(torch.zeros(32, 64))
        assert torch.allclose(packs.forward(layer, x), layer.bias.expand(8, 32))


def test_grad_or_another_dtype_takes_f_linear():
    layer = _layer(16, 8, True, 1)
    packs = PackedLinears(layer)
    x = torch.randn(4, 16, requires_grad=True)
    y = packs.forward(layer, x)  # grad enabled: the autograd path, gradients flow
    y.sum().backward()
    assert packs.packed_calls == 0 and x.grad is not None and layer.weight.grad is not None
    with torch.no_grad():
        packs.forward(layer, torch.randn(4, 16))
        assert packs.packed_calls == 1
        layer64 = layer.double()
        packs.forward(layer64, torch.randn(4, 16, dtype=torch.float64))
        assert packs.packed_calls == 1


def test_active_routes_and_restores_even_on_error(monkeypatch):
    monkeypatch.setattr(pl, "MIN_ELEMENTS", 0)
    model = torch.nn.Sequential(_layer(8, 8, False, 2), torch.nn.ReLU(), _layer(8, 4, True, 3))
    packs = PackedLinears(model)
    assert len(packs.layers) == 2
    x = torch.randn(2, 8)
    with torch.no_grad():
        want = model(x)
        with packs.active():
            got = model(x)
        assert packs.packed_calls == 2 and torch.allclose(got, want, atol=1e-5)
        with pytest.raises(RuntimeError), packs.active():
            raise RuntimeError("boom")
    assert all("forward" not in m.__dict__ for m in model)
    model(x)
    assert packs.packed_calls == 2


def test_small_layers_stay_on_f_linear():
    """Below MIN_ELEMENTS a oneDNN call's overhead outweighs the packing it saves."""
    small, big = _layer(64, 64, False, 5), _layer(512, 512, False, 6)
    packs = PackedLinears(torch.nn.Sequential(small, big))
    assert packs.layers == [big]


def test_a_layer_with_its_own_forward_is_left_alone(monkeypatch):
    monkeypatch.setattr(pl, "MIN_ELEMENTS", 0)
    layer = _layer(8, 8, False, 4)
    seen = []
    layer.forward = lambda x: seen.append(1) or F.linear(x, layer.weight)
    packs = PackedLinears(layer)
    with torch.no_grad(), packs.active():
        layer(torch.randn(1, 8))
    assert seen == [1] and packs.packed_calls == 0 and "forward" in layer.__dict__


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    texts = ["<tool_call>{\"name\": \"ls\", \"arguments\": {}}</tool_call> ok " * 8] * 4
    model, _ = load_model(build_tiny(texts, tmp_path_factory.mktemp("p") / "m", seed=0))
    return model.eval()


def test_stepper_decodes_the_same_greedy_tokens_packed_or_not(tiny, monkeypatch):
    monkeypatch.setattr(pl, "MIN_ELEMENTS", 0)  # every layer of the tiny model
    prompts = [[5 + (3 * i + j) % 50 for j in range(20 + 7 * i)] for i in range(4)]
    runs = {}
    for packed in (True, False):
        s = HFStepper(tiny, 0, packed=packed)
        logits, toks, all_logits = s.prefill(prompts), [], []
        for _ in range(24):
            t = logits.argmax(-1)
            toks.append(t.tolist())
            logits = s.extend([[int(a)] + ([9, 10] if i == 1 else []) for i, a in enumerate(t)])
            all_logits.append(logits)
        runs[packed] = (toks, torch.stack(all_logits), s.packs)
    assert runs[True][0] == runs[False][0]
    assert torch.allclose(runs[True][1], runs[False][1], atol=1e-4)
    assert runs[True][2] is not None and runs[True][2].packed_calls > 0
    assert runs[False][2] is None
    assert all("forward" not in m.__dict__ for m in tiny.modules())
