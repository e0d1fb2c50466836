"""A KV cache that grows in blocks and is written in place (the decode loop's cache).

transformers' ``DynamicLayer`` concatenates every new token onto the whole cache, so each
one-token decode step copies every layer's keys and values (at batch 8 and 600 tokens of
SmolLM2 context, 18 % of a step's CPU time went to ``aten::cat``; docs/profiling.md).
``BlockLayer`` keeps a buffer with room for ``BLOCK`` more positions, writes new keys and values
into it, and hands attention a view of the filled part; it reallocates (one copy) only when the
buffer is full. The arithmetic is unchanged: attention sees the same keys and values in the same
order, so logits are bitwise those of ``DynamicCache`` (``tests/model/test_kv_cache.py``).

    cache = block_cache()          # a DynamicCache whose layers are BlockLayers
    mask = compact(cache, mask)    # drop padded positions every row masks (below)

Rows of a lockstep batch append chunks of different lengths (one row a 200-token tool response,
the others one token), so every forward pads the shorter rows with masked slots, and the
prompts are left-padded. Attention still reads those slots: in a SmolLM2 rollout of 8 steered
dev episodes 41 % of the positions a decode step read were padding (``bench.rollout_engine``,
``kv_real_share``). ``compact`` moves each row's real positions to the right end of a shorter
cache, in their order, and returns the matching mask: the keys and values (RoPE already applied,
positions are explicit) and what each row attends to are unchanged.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

BLOCK = 256  # positions added per reallocation


class BlockLayer(DynamicLayer):
    """One layer's keys and values in a preallocated buffer; ``keys``/``values`` are views."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor,
                            *args: object) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._n = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, m = self._n, key_states.shape[-2]
        if self._k is None or self._v is None or n + m > self._k.shape[-2]:
            cap = ((n + m) // BLOCK + 1) * BLOCK
            k = key_states.new_empty(*key_states.shape[:-2], cap, key_states.shape[-1])
            v = value_states.new_empty(*value_states.shape[:-2], cap, value_states.shape[-1])
            if n and self._k is not None and self._v is not None:
                k[..., :n, :] = self._k[..., :n, :]
                v[..., :n, :] = self._v[..., :n, :]
            self._k, self._v = k, v
        self._k[..., n:n + m, :] = key_states
        self._v[..., n:n + m, :] = value_states
        self._n = n + m
        self._views()
        return self.keys, self.values

    def _views(self) -> None:
        assert self._k is not None and self._v is not None
        self.keys, self.values = self._k[..., :self._n, :], self._v[..., :self._n, :]

    def get_seq_length(self) -> int:
        return self._n if self.is_initialized else 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized and self._n and self._k is not None and self._v is not None:
            self._k, self._v = self._k[indices], self._v[indices]
            self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized and self._n and self._k is not None and self._v is not None:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._views()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count")
        if tokens_to_remove and self.is_initialized:
            self._n = max(0, self._n + tokens_to_remove)
            self._views()

    def reset(self) -> None:
        self._k = self._v = None
        self._n = 0
        super().reset()


def block_cache() -> DynamicCache:
    """A ``DynamicCache`` whose layers are created as ``BlockLayer`` (plain ``DynamicCache`` on a
    transformers without per-layer classes)."""
    cache = DynamicCache()
    if hasattr(cache, "layer_class_to_replicate") and not cache.layers:
        cache.layer_class_to_replicate = BlockLayer
    return cache


def compact(cache: DynamicCache, mask: torch.Tensor) -> torch.Tensor:
    """Keep only as many positions as the row with most real tokens holds: each row's real
    positions move, in order, to the right end (left padding before them). Returns the new
    ``[B, L']`` mask; every layer of `cache` is rewritten to match (one copy of the real part).
    Every new layer is built before any is replaced, so a failure (out of memory) leaves the
    cache as it was. Not for sliding-window attention: its window counts cache slots, which
    compaction moves (``HFStepper`` never compacts such a model)."""
    real = mask.sum(-1)
    width = int(real.max()) if mask.numel() else 0
    if width == mask.shape[-1]:
        return mask
    # a stable sort of 0/1 puts each row's pads first and keeps its real positions in order
    order = torch.sort(mask.to(torch.int8), dim=-1, stable=True).indices[:, mask.shape[-1] - width:]
    built = []
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.get_seq_length() == 0:
            continue
        k, v = layer.keys, layer.values
        idx = order.to(k.device)[:, None, :, None].expand(k.shape[0], k.shape[1], width,
                                                          k.shape[-1])
        k, v = k.gather(2, idx), v.gather(2, idx)
        if isinstance(layer, BlockLayer):
            cap = (width // BLOCK + 1) * BLOCK
            kb = k.new_empty(*k.shape[:-2], cap, k.shape[-1])
            vb = v.new_empty(*v.shape[:-2], cap, v.shape[-1])
            kb[..., :width, :], vb[..., :width, :] = k, v
            k, v = kb, vb
        built.append((layer, k, v))
    for layer, k, v in built:
        if isinstance(layer, BlockLayer):
            layer._k, layer._v, layer._n = k, v, width
            layer._views()
        else:
            layer.keys, layer.values = k, v
    return mask.gather(-1, order.to(mask.device))
