"""Logits only where the update reads them: the vocabulary projection at trained positions.

A rollout's episode is mostly context (the prompt, tool descriptions, real responses): in a tiny
`envace` step 31,404 of 32,630 tokens. The update needs next-token logits only where a token is
trained (or, with `real_obs_coef`, where a real response token is learned), yet a plain forward
projects every position onto the vocabulary and the loss then takes a log-softmax over
[batch, length, vocabulary] in fp32 (for SmolLM2, 49,152 columns per position). Here the decoder
runs over the whole sequence as before and the projection runs on the selected rows only; the
numbers are those of the full forward at those positions (``tests/model/test_trained_logits.py``).

A model without the usual `CausalLM` layout (a base model under ``base_model_prefix`` and an
``lm_head``), or one that is sharded (an FSDP root gathers its parameters in its own forward,
so its submodules are not called on their own), takes the full forward and the rows are picked
afterwards.
"""

from __future__ import annotations

import torch
from torch import Tensor


def split_forward(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(decoder, projection) of a causal LM, or None when it does not have that layout."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
        return None  # the projection is followed by more arithmetic: keep the model's own
    base = getattr(model, getattr(model, "base_model_prefix", "") or "", None)
    head = getattr(model, "lm_head", None)
    if isinstance(base, torch.nn.Module) and isinstance(head, torch.nn.Module) \
            and base is not model:
        return base, head
    return None


def selected_logits(model: torch.nn.Module, ids: Tensor, attn: Tensor, sel: Tensor,
                    whole: bool = False) -> Tensor:
    """Next-token logits ``[N, V]`` at the positions ``sel [B, T-1]`` (row-major order): row t of
    a sequence predicts ``ids[:, t + 1]``. ``whole``: compute every position, then pick."""
    parts = None if whole else split_forward(model)
    if parts is None:
        return model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1][sel]
    base, head = parts
    hidden = base(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state[:, :-1]
    return head(hidden[sel])


def scatter_rows(values: Tensor, sel: Tensor) -> Tensor:
    """``values [N]`` of the selected positions back to ``[B, T-1]`` (0 elsewhere), keeping the
    gradient."""
    return torch.zeros(sel.shape, dtype=values.dtype, device=values.device).masked_scatter(
        sel, values)
