"""The generation backend protocol, its transformers implementation, and the episode loop over it.

A backend writes one *message* per request: given whole token sequences, it samples each one's
continuation until a stop token (``<|im_end|>``) or a token cap, and returns the tokens with their
sampling log-probabilities. After an optimizer step the trainer hands it the new weights.

    backend = HFBackend(model)                                   # or VLLMBackend(path)
    gens = backend.generate([ids_a, ids_b], SamplingSpec(temperature=0, stop_ids=(im_end,)),
                            max_new_tokens=[64, 64])
    backend.update_weights(model.state_dict())
    episodes = run_episodes_backend(backend, tokenizer, tasks, RolloutConfig(mode="rehearse"))

``run_episodes_backend`` is the rollout engine's episode logic (``envace.model.rollout.Engine``:
same parser, forced texts, limits and end reasons) driven one message at a time: forced text (tool
headers, real responses, user turns) only joins the token sequence, and the next request's prompt is
the *whole* sequence so far. A backend that cannot extend a live sequence with forced tokens (vLLM)
still re-encodes nothing it has seen: its prefix cache finds every full KV block of the earlier
prompt and messages and prefills only the new tail. With greedy decoding it yields the same episodes
token for token as ``envace.model.rollout.run_episodes`` (tests/vllm/ checks this).
``HFBackend`` is the reference implementation (it re-prefills every request; rollouts on
transformers keep using ``run_episodes`` and its kept cache).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from envace.core.timing import NULL_TIMER

if TYPE_CHECKING:
    from envace.core.envs.bfcl.tasks import Task
    from envace.core.timing import Timer
    from envace.core.worldmodel import WorldModel
    from envace.model.rollout import Episode, RolloutConfig


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample one message. temperature 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256  # default cap per request
    stop_ids: tuple[int, ...] = ()  # a message ends with (and includes) the first of these


@dataclass
class Generation:
    """One written message."""

    ids: list[int]  # generated tokens; the stop token is the last one when ``stopped``
    logprobs: list[float]  # per token, under logits / temperature (raw logits when greedy)
    stopped: bool  # True: ended on a stop token; False: reached its token cap


@runtime_checkable
class GenerationBackend(Protocol):
    """What the episode loop and the trainer need from a generation engine."""

    name: str

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec,
                 max_new_tokens: Sequence[int] | None = None,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        """One message per prompt (token ids), in order; per-prompt caps and sampling seeds."""
        ...

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load new weights (Hugging Face parameter names); later requests use them."""
        ...


class HFBackend:
    """The protocol on a transformers model: batched prefill of all prompts, lockstep decoding."""

    name = "hf"

    def __init__(self, model: torch.nn.Module, pad_id: int, decode_threads: int = 1,
                 packed: bool = True) -> None:
        self.model, self.pad_id, self.decode_threads = model, pad_id, decode_threads
        self.packed = packed  # HFStepper's oneDNN-packed linear layers

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec,
                 max_new_tokens: Sequence[int] | None = None,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        # lazy: loads transformers: only this path needs it
        from envace.model.backends.hf import HFStepper, sample

        caps = list(max_new_tokens) if max_new_tokens is not None \
            else [spec.max_new_tokens] * len(prompts)
        # one generator for the batch: seeded by the first request's seed (per-row streams
        # would cost a sampling call per row)
        gen = torch.Generator().manual_seed(int(seeds[0])) if seeds else None
        was_training = self.model.training
        self.model.eval()
        stepper = HFStepper(self.model, self.pad_id, self.decode_threads, self.packed)
        logits = stepper.prefill([list(p) for p in prompts])
        out = [Generation([], [], False) for _ in prompts]
        live = [c > 0 for c in caps]
        stops = set(spec.stop_ids)
        while any(live):
            toks, logps = sample(logits, spec.temperature, spec.top_p, gen)
            feed = []
            for i, g in enumerate(out):
                if live[i]:
                    tok = int(toks[i])
                    g.ids.append(tok)
                    g.logprobs.append(float(logps[i]))
                    if tok in stops:
                        g.stopped, live[i] = True, False
                    elif len(g.ids) >= caps[i]:
                        live[i] = False
                feed.append(g.ids[-1] if g.ids else self.pad_id)
            if not any(live):
                break
            logits = stepper.step(feed, live)
        self.model.train(was_training)
        return out

    @torch.no_grad()
    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        own = self.model.state_dict()
        for k, v in state_dict.items():
            if own[k].data_ptr() != v.data_ptr():
                own[k].copy_(v)


def run_episodes_backend(backend: GenerationBackend, tokenizer: Any, tasks: Sequence[Task],
                         cfg: RolloutConfig, simulator: WorldModel | None = None,
                         world_backend: GenerationBackend | None = None,
                         timer: Timer | None = None) -> list[Episode]:
    """``envace.model.rollout.run_episodes`` on a message-level backend; episodes in task order.

    Each round, every live episode takes its forced text, then all of them write their next
    message in one batched request (rehearsals go to ``world_backend`` when given: mode
    ``split``). Caps keep a message within ``max_new_tokens`` and the context limit, so limits
    and end reasons are those of ``run_episodes``. Sampling is seeded per request from
    ``cfg.seed``, the episode's index and its message count. ``timer``: each request is a
    ``rollout/decode`` section (a backend's prefill of the new tail is inside it; forced text
    costs no forward here).
    """
    # lazy: loads transformers: only this path needs it
    from envace.model.rollout import Engine, close_rows, push_token

    timer = NULL_TIMER if timer is None else timer

    eng = Engine(None, tokenizer, cfg, simulator)
    rows, prompt_lens = eng.start_all(tasks)
    try:  # every episode's environment process ends with the rollout, however it ends
        spec = SamplingSpec(cfg.temperature, cfg.top_p, cfg.max_new_tokens, (eng.im_end,))
        sent = [0] * len(rows)
        while True:
            for r in rows:  # forced text only joins the sequence: the next prompt encodes it
                while r.done is None and r.queue:
                    push_token(eng, r, 0, 0.0, cfg, tokenizer)
            live = [i for i, r in enumerate(rows) if r.done is None]
            if not live:
                break
            groups: dict[int, list[int]] = {}
            for i in live:
                wm = world_backend is not None and rows[i].gen == "rehearse"
                groups.setdefault(int(wm), []).append(i)
            for wm, idx in groups.items():
                be = world_backend if wm else backend
                assert be is not None
                caps = [min(cfg.max_new_tokens, cfg.max_context - len(rows[i].ids)) for i in idx]
                seeds = [(cfg.seed * 1_000_003 + i * 7_919 + sent[i]) % 2**31 for i in idx]
                with timer.section("rollout/decode"):
                    gens = be.generate([rows[i].ids for i in idx], spec, caps, seeds)
                for i, g in zip(idx, gens, strict=True):
                    sent[i] += 1
                    r = rows[i]
                    for tok, lp in zip(g.ids, g.logprobs, strict=True):
                        if push_token(eng, r, tok, lp, cfg, tokenizer):
                            break
                    else:  # the backend stopped early for a reason of its own
                        r.done = r.done or "backend_stop"
        return [eng.episode(r, n) for r, n in zip(rows, prompt_lens, strict=True)]
    finally:
        close_rows(rows)


__all__ = ["Generation", "GenerationBackend", "HFBackend", "SamplingSpec",
           "run_episodes_backend"]
