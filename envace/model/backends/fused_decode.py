"""A one-token decode step that walks the decoder's weights directly (issue #18 item 2: fewer
Python round-trips per token).

A transformers forward of one token per row goes through the whole module tree every step:
the model, every decoder layer, attention, MLP and norm module, keyword plumbing, output
classes and mask construction. ``FusedDecoder`` computes the same step from the same parameters
with the ops the arithmetic needs and nothing else (what it buys, measured: docs/profiling.md,
"Fused one-token steps"):

    dec = FusedDecoder(model, linear)            # linear(layer, x): F.linear or packed
    logits = dec(ids, mask, pos, cache)          # [B] one token per row -> [B, V]

It supports the decoder families the presets use, Llama (SmolLM2), Qwen2 and Qwen3 (``q_norm``
and ``k_norm``), with SiLU MLPs, full attention (no sliding window) and any rotary scaling the
model's own ``rotary_emb`` computes; ``fusable`` says whether a model qualifies, and
``HFStepper`` falls back to the model's own forward when it does not and for every chunk wider
than one token. The keys and values go through the stepper's cache (``kv_cache.BlockLayer``)
exactly as the model's forward puts them there, so the two paths can alternate freely.
Attention is the same ``scaled_dot_product_attention`` call on the same shapes as transformers'
decode path (queries grouped per key-value head, a boolean padding mask), so logits equal the
model's own to float rounding (``tests/test_fused_decode.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from envace.model.backends.kv_cache import windowed

FAMILIES = ("llama", "qwen2", "qwen3")
Linear = Callable[[torch.nn.Linear, torch.Tensor], torch.Tensor]


def fusable(model: torch.nn.Module) -> bool:
    """Whether `model` is a decoder ``FusedDecoder`` computes exactly: a Llama, Qwen2 or Qwen3
    causal LM with full attention, SiLU MLPs and no tensor-parallel split, every layer built of
    the stock modules (plain ``nn.Linear`` projections, no subclass such as an adapter's) and no
    hook or instance-level ``forward`` anywhere in it (the fused step never calls the decoder
    layer, attention or MLP modules, so it would skip them)."""
    c = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if c is None or inner is None or getattr(c, "model_type", None) not in FAMILIES:
        return False
    if windowed(model) or getattr(c, "pretraining_tp", 1) != 1 \
            or getattr(c, "hidden_act", "silu") != "silu":
        return False
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if not all(hasattr(inner, n) for n in needed) \
            or type(getattr(model, "lm_head", None)) is not torch.nn.Linear:
        return False
    for layer in inner.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None or not all(
                type(getattr(attn, n, None)) is torch.nn.Linear
                for n in ("q_proj", "k_proj", "v_proj", "o_proj")) or not all(
                type(getattr(mlp, n, None)) is torch.nn.Linear
                for n in ("gate_proj", "up_proj", "down_proj")):
            return False
    from torch.nn.modules import module as nn_module

    if any(getattr(nn_module, g, None) for g in (
            "_global_forward_hooks", "_global_forward_pre_hooks")):
        return False
    return not any(m._forward_hooks or m._forward_pre_hooks or "forward" in m.__dict__
                   for m in model.modules())


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FusedDecoder:
    """One decode step of a ``fusable`` model over a transformers cache of its layers."""

    def __init__(self, model: torch.nn.Module, linear: Linear | None = None,
                 concat: bool = False) -> None:
        if not fusable(model):
            raise ValueError(f"not a decoder FusedDecoder computes: "
                             f"{getattr(getattr(model, 'config', None), 'model_type', None)!r}")
        self.model = model
        inner: Any = model.model
        self.inner = inner
        self.layers = list(inner.layers[: model.config.num_hidden_layers])
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.heads = model.config.num_attention_heads
        self.kv_heads = model.config.num_key_value_heads
        self.groups = self.heads // self.kv_heads
        self.linear: Linear = linear or (lambda layer, x: F.linear(x, layer.weight, layer.bias))
        # q/k/v and gate/up as two products per layer instead of five, on weights concatenated
        # (and packed for oneDNN where it has the dtype) once per decoder: a decoder lives as
        # long as one rollout's stepper, in which no update happens; a weight or
        # bias whose storage or version counter moved is stacked again all the same (`_fresh`)
        self.concat = concat
        self._cat: list[tuple[Callable[[torch.Tensor], torch.Tensor], ...]] = []
        self._key: tuple[tuple[int, int], ...] = ()

    def _sources(self) -> list[torch.nn.Linear]:
        return [lin for layer in self.layers for lin in (
            layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
            layer.mlp.gate_proj, layer.mlp.up_proj)]

    def _fresh(self) -> list[tuple[Callable[[torch.Tensor], torch.Tensor], ...]]:
        key = tuple((t.data_ptr(), t._version) for lin in self._sources()
                    for t in (lin.weight, lin.bias) if t is not None)
        if key != self._key:
            self._cat = [(_joined(layer.self_attn.q_proj, layer.self_attn.k_proj,
                                  layer.self_attn.v_proj),
                          _joined(layer.mlp.gate_proj, layer.mlp.up_proj))
                         for layer in self.layers]
            self._key = key
        return self._cat

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
                 cache: Any) -> torch.Tensor:
        """Logits [B, V] after appending token ``ids[b]`` at position ``pos[b]`` to each row.

        `mask` [B, L] is the padding mask of the whole cache *including* the new token (1 where
        a real token sits); `cache` holds every layer's keys and values for the first L - 1
        positions and receives the new ones."""
        lin = self.linear
        b = ids.shape[0]
        x = self.inner.embed_tokens(ids.view(b, 1))  # [B, 1, d]
        cos, sin = self.inner.rotary_emb(x, position_ids=pos.view(b, 1))
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, 1, D], broadcast over heads
        allowed = mask.bool()[:, None, None, :]  # [B, 1, 1, L], shared by the grouped queries
        hd, g, nq, nk = self.head_dim, self.groups, self.heads, self.kv_heads
        joined = self._fresh() if self.concat else None
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            if joined is not None:
                qkv = joined[i][0](h).view(b, 1, nq + 2 * nk, hd)
                q, k, v = qkv[:, :, :nq], qkv[:, :, nq:nq + nk], qkv[:, :, nq + nk:]
            else:
                q = lin(a.q_proj, h).view(b, 1, -1, hd)
                k = lin(a.k_proj, h).view(b, 1, -1, hd)
                v = lin(a.v_proj, h).view(b, 1, -1, hd)
            if hasattr(a, "q_norm"):  # Qwen3
                q, k = a.q_norm(q), a.k_norm(k)
            # queries and keys rotated in one pass: [B, nq + nk, 1, D]
            qk = torch.cat((q, k), dim=2).transpose(1, 2) if joined is None or \
                hasattr(a, "q_norm") else qkv[:, :, :nq + nk].transpose(1, 2)
            qk = qk * cos + _rotate_half(qk) * sin
            q, k = qk[:, :nq], qk[:, nq:]
            keys, values = cache.update(k, v.transpose(1, 2), i)
            # one query token: its heads grouped per key-value head, as transformers does
            out = F.scaled_dot_product_attention(
                q.reshape(b, self.kv_heads, g, hd), keys, values, attn_mask=allowed,
                scale=a.scaling)
            x = x + lin(a.o_proj, out.reshape(b, 1, self.heads * hd))
            h = layer.post_attention_layernorm(x)
            m = layer.mlp
            if joined is not None:
                gate, up = joined[i][1](h).chunk(2, dim=-1)
            else:
                gate, up = lin(m.gate_proj, h), lin(m.up_proj, h)
            x = x + lin(m.down_proj, F.silu(gate) * up)
        x = self.inner.norm(x)
        return lin(self.model.lm_head, x)[:, -1]


def _joined(*layers: torch.nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
    """One product for several linear layers that read the same input: their weights (and
    biases) stacked, packed for oneDNN when this CPU has the kernel for their dtype and the
    stack is large enough (``packed_linear``'s rule); outputs side by side, in order."""
    from envace.model.backends.packed_linear import MIN_ELEMENTS, available

    w = torch.cat([lin.weight.detach() for lin in layers])
    biases = [lin.bias for lin in layers]
    bias = None if all(bb is None for bb in biases) else torch.cat([
        bb.detach() if bb is not None else w.new_zeros(lin.out_features)
        for bb, lin in zip(biases, layers, strict=True)])
    if w.device.type == "cpu" and available(w.dtype) and w.numel() >= MIN_ELEMENTS:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 8)
        return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return lambda x: F.linear(x, w, bias)
