"""Greedy generation that keeps each conversation's KV cache between its requests.

    kept = KeptPrompts(model, pad_id=tok.pad_token_id, stop_id=im_end, batch_size=8)
    outs = kept.generate(["a", "b"], [prompt_a, prompt_b], max_new_tokens=256)  # ids per key
    outs = kept.generate(["a"], [prompt_a_longer], 256)       # "b" missing: dropped, "a" reused
    kept.stream([("a", prompt_a), ("b", prompt_b)], next_of, 256)  # next_of(key, ids): next prompt

Every key (a conversation: one trajectory of the probe) keeps the token ids whose keys and
values it already holds and, per layer, those keys and values. A new prompt of the key is
compared with the kept ids: their longest common prefix is reused and only the rest is encoded
(at least the prompt's last token, whose logits start the answer). Whatever the kept ids hold
after that prefix (the answer generated last time, when the real response replaces it) is
dropped. So a probe that asks at every call of a trajectory encodes each message of its history
once, not once per later call, and a prompt that is cut to the context (its window moved: the
prefix now differs early) simply encodes more again. The answer's own tokens stay kept: where the
next prompt re-encodes them identically (history "own"), they are reused too.

Each call decodes its keys on an ``backends.hf.HFStepper`` with at most ``batch_size`` rows per
forward, batched continuously: the keys wait in order of kept length; a waiting key's kept keys
and values are laid out right-aligned (RoPE was applied at each token's own position: positions
are explicit, so a row's layout does not matter) and its new tokens appended in chunks of
``FORCED_CHUNK``; its rows then decode greedily in lockstep with the rest until ``<|im_end|>`` or
``max_new_tokens``, as `model.generate` does. A row whose answer has ended leaves the batch at
once (its real positions are copied back out) and the next waiting key takes its place (the rows
still decoding and the new ones are laid out afresh in one cache), so no forward carries a
finished row and every forward carries ``batch_size`` rows while keys wait. ``stream`` goes
further: a conversation's next prompt joins the queue as soon as its answer ends (the probe
advances that trajectory at once), so answers of different rounds share forwards too.
(Fixed batches ran to their longest answer, and rounds to their longest batch: docs/profiling.md.)
The arithmetic is that of encoding the whole prompt at once up to
summation order (the matrix shapes differ): greedy answers can differ where two logits tie to
float precision (``tests/model/test_kept_prompts.py``, docs/profiling.md).
Memory: every live key's cache (SmolLM2-135M: 46 KB per token in fp32).
"""

from __future__ import annotations

import collections
import itertools
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
        self.forwards = 0  # decode forwards (one token per row)
        self.row_tokens = 0  # rows those forwards carried, summed

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
        if any(not p for p in prompts):
            raise ValueError("an empty prompt")
        was_training = self.model.training
        self.model.eval()
        try:
            queue = self._ordered(list(enumerate(zip(keys, prompts, strict=True))))
            gens = self._continuous(queue, max_new_tokens)
        finally:
            self.model.train(was_training)
        out = [gens[i] for i in range(len(keys))]
        return [self._answer(g) for g in out]

    @torch.no_grad()
    def stream(self, first: Sequence[tuple[Any, Sequence[int]]],
               next_of: Callable[[Any, list[int]], Sequence[int] | None],
               max_new_tokens: int,
               more: Callable[[], Sequence[tuple[Any, Sequence[int]]]] | None = None) -> None:
        """Answer conversations that ask again as soon as they are answered: `first` holds each
        key's first prompt; when a key's answer ends, ``next_of(key, answer_ids)`` gives the
        key's next prompt (it joins the waiting queue at once, its cache reused) or None (the
        conversation ended: its cache is dropped, and ``more()``, if given, names the new
        conversations that start in its place: (key, first prompt) pairs, new keys). So answers
        of different rounds, and of conversations that start late, share decode forwards, and
        no forward waits for a round's longest answer. Keys must be distinct."""
        keys = [k for k, _p in first]
        if len(set(keys)) != len(keys):
            raise ValueError("keys must be distinct within a call")
        wanted = set(keys)
        self.drop(lambda k: k in wanted)
        if any(not p for _k, p in first):
            raise ValueError("an empty prompt")
        count = itertools.count(len(first))
        started = set(keys)

        def then(key: Any, gen: list[int]) -> list[tuple[int, Any, list[int]]]:
            nxt = next_of(key, self._answer(gen))
            if nxt is None:
                self.kept.pop(key, None)
                joining = list(more()) if more is not None else []
                for k, p in joining:
                    if k in started or not p:
                        raise ValueError("more() must give new keys with non-empty prompts")
                    started.add(k)
                    self.kept.pop(k, None)
                return [(next(count), k, list(p)) for k, p in joining]
            if not nxt:
                raise ValueError("an empty prompt")
            return [(next(count), key, list(nxt))]

        was_training = self.model.training
        self.model.eval()
        try:
            self._continuous(self._ordered(list(enumerate(first))), max_new_tokens, then)
        finally:
            self.model.train(was_training)

    def _answer(self, gen: list[int]) -> list[int]:
        return gen[:-1] if gen and gen[-1] == self.stop_id else gen

    def _reuse(self, key: Any, prompt: Sequence[int]) -> int:
        """How much of `prompt` the key's kept cache holds (at most all but its last token,
        whose logits start the answer)."""
        held = self.kept.get(key)
        return 0 if held is None else min(common_prefix(held.ids, prompt), len(prompt) - 1)

    def _ordered(self, items: list[tuple[int, tuple[Any, Sequence[int]]]]
                 ) -> list[tuple[int, Any, list[int]]]:
        """(index, key, prompt) in order of kept length, then prompt length."""
        rows = [(i, k, list(p)) for i, (k, p) in items]
        return sorted(rows, key=lambda r: (self._reuse(r[1], r[2]), len(r[2])))

    def _continuous(self, queue: list[tuple[int, Any, list[int]]], max_new_tokens: int,
                    then: Callable[[Any, list[int]], list[tuple[int, Any, list[int]]]]
                    | None = None) -> dict[int, list[int]]:
        """Greedy answers for `queue` (index, key, prompt), at most `batch_size` rows per decode
        forward: a row whose answer ends leaves the batch at once and the next waiting prompt
        takes its place (its prompt encoded beside the batch, its key's kept cache reused, then
        laid out with the rows still decoding), so every forward carries as many rows as there
        are answers still being written, up to `batch_size`. `then(key, generated)`: the
        prompts that wait next once a row has ended (`stream`). Returns each index's generated
        ids (the stop token included; without `then`)."""
        waiting = collections.deque(queue)
        gens: dict[int, list[int]] = {}
        live: list[tuple[int, Any, list[int]]] = []  # (index, key, prompt) per stepper row
        stepper: HFStepper | None = None
        while waiting or live:
            if waiting and len(live) < self.batch_size:
                new = [waiting.popleft() for _ in range(min(self.batch_size - len(live),
                                                            len(waiting)))]
                side, first = self._encode(new, [self._reuse(k, p) for _i, k, p in new])
                going = self._pick(new, first, gens, max_new_tokens)
                waiting.extend(self._retire(side, new, going, gens, then))
                joining = [new[r] for r in going]
                if joining and live:  # the decoding rows and the joining ones in one cache
                    assert stepper is not None
                    held = self._take_out(stepper, [p + gens[i][:-1] for i, _k, p in live])
                    held += self._take_out(side, [p for _i, _k, p in joining], going)
                    stepper = self._stepper()
                    self._lay_out(stepper, held, [len(h.ids) for h in held])
                elif joining:
                    if len(joining) < len(new):
                        side.select(going)
                    stepper = side
                live += joining
                if not live:
                    continue
            assert stepper is not None
            self.forwards += 1
            self.row_tokens += len(live)
            logits = stepper.step([gens[i][-1] for i, _k, _p in live], [True] * len(live))
            going = self._pick(live, logits, gens, max_new_tokens)
            waiting.extend(self._retire(stepper, live, going, gens, then))
            live = [live[r] for r in going]
            if live and len(going) < len(logits):
                stepper.select(going)
        return gens

    def _pick(self, rows: list[tuple[int, Any, list[int]]], logits: torch.Tensor,
              gens: dict[int, list[int]], max_new_tokens: int) -> list[int]:
        """Append each row's greedy token to its answer; the rows whose answer goes on."""
        toks = logits.argmax(dim=-1).tolist()
        going = []
        for r, (i, _key, _prompt) in enumerate(rows):
            gen = gens.setdefault(i, [])
            if max_new_tokens > 0:
                gen.append(int(toks[r]))
                if gen[-1] != self.stop_id and len(gen) < max_new_tokens:
                    going.append(r)
        return going

    def _retire(self, stepper: HFStepper, rows: list[tuple[int, Any, list[int]]],
                going: list[int], gens: dict[int, list[int]],
                then: Callable[[Any, list[int]], list[tuple[int, Any, list[int]]]] | None
                ) -> list[tuple[int, Any, list[int]]]:
        """Keep each ended row's cache (its prompt and the answer tokens it fed); the prompts
        `then` queues after them."""
        on = set(going)
        ended = [r for r in range(len(rows)) if r not in on]
        fed = [rows[r][2] + gens[rows[r][0]][:-1] for r in ended]
        queued: list[tuple[int, Any, list[int]]] = []
        for r, state in zip(ended, self._take_out(stepper, fed, ended) if ended else [],
                            strict=True):
            i, key, _prompt = rows[r]
            self.kept[key] = state
            if then is not None:
                queued += then(key, gens.pop(i))
        return queued

    def _stepper(self) -> HFStepper:
        return HFStepper(self.model, self.pad_id, self.decode_threads, self.packed)

    def _encode(self, new: list[tuple[int, Any, list[int]]], reuse: list[int]
                ) -> tuple[HFStepper, torch.Tensor]:
        """A stepper holding `new`'s prompts (each key's first `reuse` kept positions laid out,
        the rest appended `FORCED_CHUNK` tokens per forward) and each row's next-token logits."""
        stepper = self._stepper()
        self._lay_out(stepper, [self.kept.get(k) for _i, k, _p in new], reuse)
        self.reused += sum(reuse)
        rest = [p[r:] for (_i, _k, p), r in zip(new, reuse, strict=True)]
        self.encoded += sum(len(r) for r in rest)
        logits: list[torch.Tensor | None] = [None] * len(new)
        done = 0
        while done < max(len(r) for r in rest):  # the new prompt tokens, FORCED_CHUNK at a time
            chunks = [r[done:done + FORCED_CHUNK] for r in rest]
            step = stepper.extend(chunks)
            for i, c in enumerate(chunks):
                if c:
                    logits[i] = step[i]
            done += FORCED_CHUNK
        return stepper, torch.stack(logits)  # type: ignore[arg-type]

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
    def _take_out(stepper: HFStepper, fed: list[list[int]],
                  rows: Sequence[int] | None = None) -> list[Kept]:
        """The real positions (in order) of `rows` (default: every row) out of the batch cache;
        `fed[j]` is the ids row `rows[j]` holds."""
        assert stepper.mask is not None and stepper.cache is not None
        mask = stepper.mask.cpu().bool()
        out = []
        for i, ids in zip(range(len(fed)) if rows is None else rows, fed, strict=True):
            cols = mask[i].nonzero().squeeze(-1)
            if len(cols) != len(ids):
                raise RuntimeError(f"row {i} holds {len(cols)} positions for {len(ids)} ids")
            cols = cols.to(stepper.device)
            layers = [(layer.keys[i].index_select(1, cols), layer.values[i].index_select(1, cols))
                      for layer in stepper.cache.layers]
            out.append(Kept(ids, layers))
        return out
