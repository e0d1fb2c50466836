"""The update's logits at trained positions only equal the full forward's at those positions,
and the loss and its gradients are those of the full forward."""

from __future__ import annotations

import pytest
import torch

from envace.model.models import build_tiny, load_model
from envace.model.trained_logits import scatter_rows, selected_logits, split_forward
from envace.training import grpo


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    texts = ["<tool_call>{\"name\": \"ls\", \"arguments\": {}}</tool_call> ok " * 8] * 4
    model, _ = load_model(build_tiny(texts, tmp_path_factory.mktemp("t") / "m", seed=0))
    return model


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 60, (3, 40), generator=g)
    attn = torch.ones_like(ids)
    attn[1, 30:] = 0  # right padding, as the update pads
    sel = torch.rand((3, 39), generator=g) < 0.3
    sel[1, 29:] = False
    return ids, attn, sel


def test_selected_logits_equal_the_full_forward(tiny):
    ids, attn, sel = _batch()
    assert split_forward(tiny) is not None
    with torch.no_grad():
        full = tiny(input_ids=ids, attention_mask=attn).logits[:, :-1][sel]
        got = selected_logits(tiny, ids, attn, sel)
        whole = selected_logits(tiny, ids, attn, sel, whole=True)
    assert got.shape == (int(sel.sum()), full.shape[-1])
    assert torch.allclose(got, full, atol=1e-5) and torch.allclose(whole, full, atol=1e-6)


def test_the_loss_and_gradients_match_the_full_forward(tiny):
    ids, attn, sel = _batch()
    old = torch.zeros(sel.shape)
    adv = torch.randn(sel.shape, generator=torch.Generator().manual_seed(1))

    def loss_grads(fast: bool):
        tiny.zero_grad(set_to_none=True)
        if fast:
            lp = scatter_rows(grpo.logprobs_from_logits(
                selected_logits(tiny, ids, attn, sel).float(), ids[:, 1:][sel]), sel)
        else:
            lp = grpo.logprobs_from_logits(
                tiny(input_ids=ids, attention_mask=attn).logits[:, :-1].float(), ids[:, 1:])
        loss, _ = grpo.policy_loss(lp, old, adv, sel, 0.2, 0.2, 3.0, "token_mean")
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in tiny.parameters() if p.grad is not None]

    (l1, g1), (l2, g2) = loss_grads(True), loss_grads(False)
    assert torch.allclose(l1, l2, atol=1e-6)
    assert len(g1) == len(g2)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g1, g2, strict=True))


def test_a_model_without_the_causal_lm_layout_takes_the_full_forward():
    class Plain(torch.nn.Module):
        def forward(self, input_ids, attention_mask, use_cache=False):
            class Out:
                logits = torch.nn.functional.one_hot(input_ids, 64).float()
            return Out()

    m = Plain()
    assert split_forward(m) is None
    ids, attn, sel = _batch()
    got = selected_logits(m, ids, attn, sel)
    assert torch.equal(got.argmax(-1), ids[:, :-1][sel])
