"""Transformers generation backend: many sequences advanced in lockstep over one kept KV cache.

Every row of the batch is an episode. A row's prompt is prefilled once (left-padded); after that
each forward step feeds exactly one token per row: the next *forced* token of that row (a tool
header, a real response, the next user turn) or the token it just *sampled*, or padding once the
row is done. Nothing already encoded is encoded again: forced text is appended to the cache like
generated text. Finished rows are masked out (their pads are never attended).

    stepper = HFStepper(model, pad_id)
    logits = stepper.prefill([[1, 2, 3], [4, 5]])        # [B, V] next-token logits
    logits = stepper.step([7, 8], active=[True, False])  # one token per row

Forced text is appended in chunks (``extend``): a real response or a user turn costs one forward,
not one per token. bench/rollout_engine.py compares this with re-encoding the whole sequence at
every message (what a plain tool loop does).

Identical prompts (the members of a GRPO group, the N plans of test-time rehearsal) are encoded
once and their cache rows copied (``prefill``); finished rows leave the batch (``select``), so
the batch never carries an episode that has ended.

The cache grows in blocks and is written in place (``kv_cache.BlockLayer``: no per-token copy
of the whole cache) and drops its padding once that cuts its width by a quarter
(``kv_cache.compact``: rows append chunks of different lengths, and attention reads every padded
slot; never for a sliding-window model); linear layers
run on weights packed once for oneDNN (``packed_linear``); the attention mask stays on the
model's device, and the vocabulary
projection runs only at the positions whose logits are used (``logits_to_keep``): the last one
of a prefill, each row's last appended token of an ``extend``.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import weakref
from collections.abc import Sequence

import torch

from envace.model.backends import kv_cache
from envace.model.backends.packed_linear import PackedLinears, available
from envace.model.models import weights_version


def _cache_kw() -> str:
    """transformers >= 5.2x renamed ``past_key_values`` to ``cache`` (the old name warns)."""
    from transformers import Qwen3ForCausalLM

    return "cache" if "cache" in inspect.signature(Qwen3ForCausalLM.forward).parameters \
        else "past_key_values"


CACHE_KW = _cache_kw()

GEN_DTYPES = {"same": None, "bfloat16": torch.bfloat16}
# the cache is compacted (padding dropped, ``kv_cache.compact``) once that leaves at most this
# share of its width (the row with most real tokens sets the new width), and it is at least
# COMPACT_MIN_WIDTH positions wide
COMPACT_BELOW = 0.75
COMPACT_MIN_WIDTH = 64
_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def generation_model(model: torch.nn.Module, dtype: str = "same") -> torch.nn.Module:
    """The model rollouts decode with: `model` itself (``same``), or a copy whose parameters are
    cast to `dtype` (``bfloat16``: on CPU its small matmuls run 1.8-2.7x faster than fp32,
    `bench/decode_profile.py`). Buffers keep their dtype (rotary frequencies stay fp32). The copy
    is kept per model and refreshed, in place, whenever `envace.model.models.weights_version`
    says the weights changed (after every optimizer step); it is always in eval mode and holds
    no gradients. Log-probabilities sampled from it are the copy's, not the fp32 model's: the
    tolerance between the two is measured in `tests/model/test_rollout.py` and
    `docs/profiling.md`."""
    if dtype not in GEN_DTYPES:
        raise ValueError(f"unknown generation dtype {dtype!r}; known: {', '.join(GEN_DTYPES)}")
    target = GEN_DTYPES[dtype]
    if target is None or next(model.parameters()).dtype == target:
        return model
    version = weights_version(model)
    held = _COPIES.get(model)
    if held is not None and held[0] == version:
        return held[1]
    if held is None:
        clone = copy.deepcopy(model)
        for p in clone.parameters():
            p.requires_grad_(False)
            p.grad = None
            p.data = p.data.to(target)
        clone.eval()
    else:
        clone = held[1]
        with torch.no_grad():
            for c, p in zip(clone.parameters(), model.parameters(), strict=True):
                c.copy_(p)
    _COPIES[model] = (version, clone)
    return clone


def windowed(model: torch.nn.Module) -> bool:
    """Whether any attention layer of `model` uses a sliding window."""
    c = getattr(model, "config", None)
    types = list(getattr(c, "layer_types", None) or [])
    if types:
        return any("sliding" in str(t) for t in types)
    return bool(getattr(c, "sliding_window", None)) and getattr(c, "use_sliding_window", True) \
        is not False


class HFStepper:
    """One batched decoding state: cache, attention mask, positions."""

    def __init__(self, model: torch.nn.Module, pad_id: int, decode_threads: int = 1,
                 packed: bool = True, compact_below: float | None = None) -> None:
        self.model = model
        # linear layers on weights packed once for oneDNN (``packed_linear``), CPU only
        on_cpu = next(model.parameters()).device.type == "cpu"
        self.packs = PackedLinears(model) if packed and on_cpu and available() else None
        self.decode_threads = decode_threads
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self.cache = None
        self.mask: torch.Tensor | None = None  # [B, L] 1 where a real token sits
        self.next_pos: torch.Tensor | None = None  # [B] position of the next token per row
        self.forward_tokens = 0  # tokens pushed through the model (benchmark bookkeeping)
        # compact the cache when that leaves at most this share of its width (0: never;
        # None: COMPACT_BELOW)
        self.compact_below = COMPACT_BELOW if compact_below is None else compact_below
        if windowed(model):  # its window counts cache slots, which compaction would move
            self.compact_below = 0.0
        self.compactions = 0
        self.real: torch.Tensor | None = None  # [B] real tokens per row (CPU)

    @torch.no_grad()
    def prefill(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Encode left-padded prompts; return the last position's logits per row.

        Each distinct prompt is encoded once; rows with the same prompt get copies of its cache.
        """
        keys = [tuple(r) for r in rows]
        first: dict[tuple[int, ...], int] = {}
        for k in keys:
            first.setdefault(k, len(first))
        if len(first) == len(rows):
            return self._prefill(rows)
        logits = self._prefill([list(k) for k in first])
        return self._gather(torch.tensor([first[k] for k in keys], dtype=torch.long), logits)

    def select(self, keep: Sequence[int]) -> None:
        """Keep only these rows of the batch (in this order); the others are dropped."""
        self._gather(torch.tensor(list(keep), dtype=torch.long))

    def forget(self, row: int, n: int) -> None:
        """Forget row ``row``'s last ``n`` tokens, as if never appended: their cache slots are
        masked (padding from now on) and the row's next position goes back by ``n``, so what is
        appended next sits where they sat (the confidence gate's discarded rehearsal)."""
        if n <= 0:
            return
        assert self.mask is not None and self.next_pos is not None and self.real is not None
        slots = self.mask[row].nonzero().flatten()[-n:]
        self.mask[row, slots] = 0
        self.next_pos[row] -= n
        self.real[row] -= n

    def _gather(self, idx: torch.Tensor, logits: torch.Tensor | None = None
                ) -> torch.Tensor | None:
        assert self.cache is not None and self.mask is not None and self.next_pos is not None
        self.cache.batch_select_indices(idx.to(self.device))
        self.mask, self.next_pos = self.mask[idx.to(self.mask.device)], self.next_pos[idx]
        self.real = self.real[idx] if self.real is not None else None
        return None if logits is None else logits[idx.to(logits.device)]

    def _prefill(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        self.cache = kv_cache.block_cache()
        self.mask = mask.to(self.device)
        with self._kernels():
            out = self.model(input_ids=ids.to(self.device), attention_mask=self.mask,
                             position_ids=pos.to(self.device), **{CACHE_KW: self.cache},
                             use_cache=True, logits_to_keep=1)
        self.next_pos = mask.sum(-1)
        self.real = self.next_pos.clone()
        self.forward_tokens += int(mask.sum())
        return out.logits[:, -1, :].float()

    def _maybe_compact(self) -> None:
        """Drop padding from the cache (``kv_cache.compact``) once that makes it at most
        `compact_below` of its width: the row with the most real tokens sets the new width.
        The real counts live on the CPU (``self.real``): deciding costs no device sync."""
        assert self.mask is not None and self.real is not None
        width = self.mask.shape[1]
        if (self.compact_below > 0 and width >= COMPACT_MIN_WIDTH and len(self.real)
                and int(self.real.max()) <= self.compact_below * width):
            self.mask = kv_cache.compact(self.cache, self.mask)
            self.compactions += self.mask.shape[1] < width

    def _kernels(self) -> contextlib.AbstractContextManager:
        return self.packs.active() if self.packs is not None else contextlib.nullcontext()

    def step(self, tokens: Sequence[int], active: Sequence[bool]) -> torch.Tensor:
        """Append one token per active row; return next logits."""
        return self.extend([[t] if a else [] for t, a in zip(tokens, active, strict=True)])

    @torch.no_grad()
    def extend(self, chunks: Sequence[Sequence[int]]) -> torch.Tensor:
        """Append a chunk of tokens per row (rows may differ in length; [] for a row that waits
        or is done): one forward of width max(len); shorter rows are padded with masked slots.
        Returns each row's logits after its own last appended token.

        Runs on ``decode_threads`` threads: one-token matmuls are too small to share, and on a
        busy machine OpenMP threads waiting for a core cost 100x (measured here).
        """
        threads = torch.get_num_threads()
        torch.set_num_threads(self.decode_threads)
        try:
            return self._extend(chunks)
        finally:
            torch.set_num_threads(threads)

    def _extend(self, chunks: Sequence[Sequence[int]]) -> torch.Tensor:
        assert self.mask is not None and self.next_pos is not None
        self._maybe_compact()
        width = max(1, max(len(c) for c in chunks))
        n = torch.tensor([len(c) for c in chunks], dtype=torch.long)
        ids = torch.full((len(chunks), width), self.pad_id, dtype=torch.long)
        new_mask = torch.zeros((len(chunks), width), dtype=torch.long)
        for i, c in enumerate(chunks):
            if c:
                ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
                new_mask[i, : len(c)] = 1
        self.mask = torch.cat([self.mask, new_mask.to(self.device)], dim=1)
        pos = self.next_pos[:, None] + torch.arange(width)[None, :]
        last = (n - 1).clamp(min=0)
        # the vocabulary projection only where a row's next-token logits are read
        keep = torch.unique(last)  # sorted
        with self._kernels():
            out = self.model(input_ids=ids.to(self.device), attention_mask=self.mask,
                             position_ids=pos.to(self.device), **{CACHE_KW: self.cache},
                             use_cache=True,
                             logits_to_keep=1 if width == 1 else keep.to(self.device))
        self.next_pos = self.next_pos + n
        self.real = self.real + n
        self.forward_tokens += int(n.sum())
        col = torch.zeros(len(chunks), dtype=torch.long) if width == 1 \
            else torch.searchsorted(keep, last)
        return out.logits[torch.arange(len(chunks)), col.to(out.logits.device)].float()


def sample(logits: torch.Tensor, temperature: float, top_p: float,
           generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (tokens, log-probabilities under logits/temperature).

    temperature 0 means greedy (log-probabilities then under the raw logits).
    """
    if temperature <= 0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logits.argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    scaled = logits / temperature
    logp = torch.log_softmax(scaled, dim=-1)
    probs = logp.exp()
    if top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
    tok = torch.multinomial(probs / probs.sum(-1, keepdim=True), 1, generator=generator)
    tok = tok.squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
