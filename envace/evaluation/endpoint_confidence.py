"""Confidence of a served world model's answers: `envace probe --endpoint URL --confidence`.

The in-process probe's ``--confidence`` (`envace.evaluation.likelihood.with_confidence`) scores
each answer teacher-forced after the prompt it was generated from, with its end marker: the
log-probability the model wrote it with. A served model is scored the same way, on the server:
the prompt (cut to ``context - max_new_tokens`` tokens as the local probe cuts it), the answer's
tokens and ``<|im_end|>`` go to ``/v1/completions`` as token ids with vLLM's
``prompt_logprobs: 0`` (the request of the served likelihood audit,
`envace.evaluation.endpoint_likelihood`), and the answer's ``confidence`` is the mean of those
tokens' log-probabilities, ``confidence_min`` the lowest. So, for the same model, the served
and the in-process figures agree to the server's arithmetic (the vLLM lane tests it).

Why not the generation's own ``logprobs``: whether the closing end marker's log-probability is
among them depends on the server (a stop string or an end-of-sequence token, and its version),
so the figure would not be the one every other path records. The price is one more request per
answered call, at the cost of a prefill. A server that cannot return prompt log-probabilities is
refused before the probe starts (`PromptLogprobsUnsupported`, one line); a scoring request that
still fails after its retries leaves that answer without a confidence (it is still audited).
Torch-free.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from audit.stats.confidence import Rehearsal
from envace.evaluation.endpoint_likelihood import request_body, token_logprobs
from envace.model.chat import IM_END, encode_text, marker_id
from envace.model.endpoint import EndpointClient
from envace.model.windows import prompt_budget, prompt_ids


class ServedConfidence:
    """Wraps a batch world model (`audit.probe.BatchAnswer`) of a served model: its text
    answers come back as `Rehearsal`, scored on the server (at most ``concurrency`` requests in
    flight); ``failed`` counts the scoring requests that failed, by reason."""

    def __init__(self, client: EndpointClient, tokenizer: Any, context: int,
                 max_new_tokens: int, answer: Callable[[list[Any]], list[Any]],
                 concurrency: int = 4) -> None:
        self.client, self.tokenizer, self.answer = client, tokenizer, answer
        self.budget = prompt_budget(context, max_new_tokens)
        self.stop = marker_id(tokenizer, IM_END)
        self.concurrency = concurrency
        self.requests = 0
        self.failed: Counter[str] = Counter()

    def ids(self, request: Any, text: str) -> tuple[list[int], int]:
        """The scored request's token ids and where the answer starts in them."""
        messages, tools, _tool, _args = request
        prompt = prompt_ids(self.tokenizer, messages, tools, "tool", self.budget)
        return prompt + encode_text(self.tokenizer, text) + [self.stop], len(prompt)

    def _score(self, job: tuple[list[int], int]) -> tuple[float, int, float] | str:
        ids, start = job
        data, error, _ = self.client.post("/completions", request_body(self.client, ids))
        if data is None:
            return f"server: {error}"
        try:
            lps = token_logprobs(data, ids)[start:]
        except ValueError as exc:
            return f"server: {exc}"
        if not lps or any(v is None or not math.isfinite(v) for v in lps):
            return "server: a scored token has no finite log-probability"
        vals = [float(v) for v in lps if v is not None]
        return sum(vals), len(vals), min(vals)

    def __call__(self, requests: list[Any]) -> list[Any]:
        texts = self.answer(requests)
        where = [k for k, t in enumerate(texts) if isinstance(t, str)]
        jobs = [self.ids(requests[k], str(texts[k])) for k in where]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            got = list(pool.map(self._score, jobs))
        self.requests += len(jobs)
        out = list(texts)
        for k, res in zip(where, got, strict=True):
            if isinstance(res, str):
                self.failed[res[:120]] += 1
                continue
            logprob, tokens, lowest = res
            out[k] = Rehearsal.of(str(texts[k]), logprob, tokens, lowest)
        return out

    def block(self) -> dict[str, Any]:
        """What the summary's ``endpoint`` block says of the scoring."""
        return {"confidence": "mean token log-probability of each answer and its end marker, "
                              "teacher-forced on the server (prompt_logprobs 0, token-id prompt)",
                "confidence_requests": self.requests,
                "confidence_failed": sum(self.failed.values()),
                "confidence_failed_reasons": dict(self.failed.most_common())}
