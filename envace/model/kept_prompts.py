"""Greedy generation that keeps each conversation's KV cache between its requests.

    kept = KeptPrompts(model, pad_id=tok.pad_token_id, stop_id=im_end, batch_size=8)
    outs = kept.generate(["a", "b"], [prompt_a, prompt_b], max_new_tokens=256)  # ids per key
    outs = kept.generate(["a"], [prompt_a_longer], 256)       # "b" missing: dropped, "a" reused

Every key (a conversation: one trajectory of the probe) keeps the token ids whose keys and
values it already holds and, per layer, those keys and values. A new prompt of the key is
compared with the kept ids: their longest common prefix is reused and only the rest is encoded
(at least the prompt's last token, whose logits start the answer). Whatever the kept ids hold
after that prefix (the answer generated last time, when the real response replaces it) is
dropped. So a probe that asks at every call of a trajectory encodes each message of its history
once, not once per later call, and a prompt that is cut to the context (its window moved: the
prefix now differs early) simply encodes more again. The answer's own tokens stay kept: where the
next prompt re-encodes them identically (history "own"), they are reused too.

Each call batches its keys (``batch_size`` rows, ordered by kept length) over an
``backends.hf.HFStepper``: each row's kept keys and values are laid out right-aligned in one
cache (RoPE was applied at each token's own position: positions are explicit, so a row's layout
does not matter), the new tokens are appended in chunks of ``FORCED_CHUNK``, and rows decode
greedily in lockstep until ``<|im_end|>`` or ``max_new_tokens``, as `model.generate` does; then
each row's real positions are copied back out. The arithmetic is that of encoding the whole
prompt at once up to summation order (the matrix shapes differ): greedy answers can differ where
two logits tie to float precision (``tests/model/test_kept_prompts.py``, docs/profiling.md).
Memory: every live key's cache (SmolLM2-135M: 46 KB per token in fp32).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from envace.model.backends.hf import HFStepper
from envace.model.backends.kv_cache import block_cache

FORCED_CHUNK = 256  # new prompt tokens appended per forward and row


@dataclass
class Kept:
    """One key's kept state: the ids whose keys/values are held, and per layer (K, V) of shape
    ``[kv_heads, len(ids), head_dim]``."""

    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class KeptPrompts:
    """Kept caches per key, and batched greedy generation over them."""

    def __init__(self, model: Any, pad_id: int, stop_id: int, batch_size: int = 8,
                 decode_threads: int = 1, packed: bool = False) -> None:
        self.model, self.pad_id, self.stop_id = model, pad_id, stop_id
        self.batch_size = max(1, batch_size)
        self.decode_threads, self.packed = decode_threads, packed
        self.kept: dict[Any, Kept] = {}
        self.reused = 0  # prompt tokens taken from a kept cache (bookkeeping)
        self.encoded = 0  # prompt tokens encoded

    def drop(self, keep: Callable[[Any], bool]) -> None:
        """Forget every key for which `keep` is false."""
        for k in [k for k in self.kept if not keep(k)]:
            del self.kept[k]

    @torch.no_grad()
    def generate(self, keys: Sequence[Any], prompts: Sequence[Sequence[int]],
                 max_new_tokens: int) -> list[list[int]]:
        """Each prompt's greedy continuation (ids, without the stop token), reusing and then
        keeping its key's cache. Keys not given are dropped first (their conversations ended).
        Keys must be distinct."""
        if len(set(keys)) != len(keys):
            raise ValueError("keys must be distinct within a call")
        wanted = set(keys)
        self.drop(lambda k: k in wanted)
        if not keys:
            return []
        was_training = self.model.training
        self.model.eval()
        reuse = []
        for key, prompt in zip(keys, prompts, strict=True):
            if not prompt:
                raise ValueError("an empty prompt")
            held = self.kept.get(key)
            reuse.append(0 if held is None else min(common_prefix(held.ids, prompt),
                                                    len(prompt) - 1))
        order = sorted(range(len(keys)), key=lambda i: (reuse[i], len(prompts[i])))
        out: list[list[int]] = [[] for _ in keys]
        for a in range(0, len(order), self.batch_size):
            idx = order[a:a + self.batch_size]
            gens = self._batch([keys[i] for i in idx], [list(prompts[i]) for i in idx],
                               [reuse[i] for i in idx], max_new_tokens)
            for i, g in zip(idx, gens, strict=True):
                out[i] = g
        self.model.train(was_training)
        return out

    def _batch(self, keys: list[Any], prompts: list[list[int]], reuse: list[int],
               max_new_tokens: int) -> list[list[int]]:
        stepper = HFStepper(self.model, self.pad_id, self.decode_threads, self.packed)
        self._lay_out(stepper, [self.kept.get(k) for k in keys], reuse)
        self.reused += sum(reuse)
        rest = [p[r:] for p, r in zip(prompts, reuse, strict=True)]
        self.encoded += sum(len(r) for r in rest)
        logits = [None] * len(keys)
        done = 0
        while done < max(len(r) for r in rest):  # the new prompt tokens, FORCED_CHUNK at a time
            chunks = [r[done:done + FORCED_CHUNK] for r in rest]
            step = stepper.extend(chunks)
            for i, c in enumerate(chunks):
                if c:
                    logits[i] = step[i]
            done += FORCED_CHUNK
        last = torch.stack(logits)  # type: ignore[arg-type]
        gens: list[list[int]] = [[] for _ in keys]
        live = [max_new_tokens > 0] * len(keys)
        while any(live):
            toks = last.argmax(dim=-1).tolist()
            feed = []
            for i, g in enumerate(gens):
                if live[i]:
                    g.append(int(toks[i]))
                    if g[-1] == self.stop_id or len(g) >= max_new_tokens:
                        live[i] = False
                feed.append(g[-1] if g else self.pad_id)
            if not any(live):
                break
            last = stepper.step(feed, live)
        fed = [p + (g[:-1] if g else []) for p, g in zip(prompts, gens, strict=True)]
        for key, state in zip(keys, self._take_out(stepper, fed), strict=True):
            self.kept[key] = state
        return [g[:-1] if g and g[-1] == self.stop_id else g for g in gens]

    def _lay_out(self, stepper: HFStepper, held: list[Kept | None], reuse: list[int]) -> None:
        """Start `stepper` with each row's first `reuse` kept positions, right-aligned."""
        width = max(reuse)
        stepper.cache = block_cache()
        mask = torch.zeros((len(held), width), dtype=torch.long)
        for i, n in enumerate(reuse):
            mask[i, width - n:] = 1
        if width:
            layers = next(h for h in held if h is not None and h.layers).layers
            for li, (k0, v0) in enumerate(layers):
                k = k0.new_zeros(len(held), k0.shape[0], width, k0.shape[-1])
                v = v0.new_zeros(len(held), v0.shape[0], width, v0.shape[-1])
                for i, (h, n) in enumerate(zip(held, reuse, strict=True)):
                    if n:
                        assert h is not None
                        k[i, :, width - n:] = h.layers[li][0][:, :n]
                        v[i, :, width - n:] = h.layers[li][1][:, :n]
                stepper.cache.update(k, v, li)
        stepper.mask = mask.to(stepper.device)
        stepper.next_pos = torch.tensor(reuse, dtype=torch.long)
        stepper.real = stepper.next_pos.clone()

    @staticmethod
    def _take_out(stepper: HFStepper, fed: list[list[int]]) -> list[Kept]:
        """Each row's real positions (in order) out of the batch cache."""
        assert stepper.mask is not None and stepper.cache is not None
        mask = stepper.mask.cpu().bool()
        out = []
        for i, ids in enumerate(fed):
            cols = mask[i].nonzero().squeeze(-1)
            if len(cols) != len(ids):
                raise RuntimeError(f"row {i} holds {len(cols)} positions for {len(ids)} ids")
            cols = cols.to(stepper.device)
            layers = [(layer.keys[i].index_select(1, cols), layer.values[i].index_select(1, cols))
                      for layer in stepper.cache.layers]
            out.append(Kept(ids, layers))
        return out
