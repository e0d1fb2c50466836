"""The likelihood audit of a served model: `envace probe --likelihood --endpoint URL --model NAME`.

The windows are the in-process audit's (``envace.evaluation.likelihood.plan_windows``: one per
trajectory where it fits ``context``, one per call where it does not), built with the served
model's tokenizer (``--tokenizer``, a local copy of its folder). Each window goes to the
OpenAI-compatible ``/v1/completions`` as its token ids (``prompt``: a list of ints, so the server
scores exactly the chat-template tokens the local audit scores), with vLLM's ``prompt_logprobs: 0``
(the log-probability of every prompt token; ``0``: no alternatives besides the token itself),
``max_tokens: 1`` and ``temperature: 0``. vLLM answers ``choices[0].prompt_logprobs``: one
entry per prompt token, ``null`` for the first, else ``{"<token id>": {"logprob": float, "rank":
int, "decoded_token": str}}``; ``-inf`` is sent as ``-9999.0``. A step's ``nats`` is minus the
sum over its response tokens and ``<|im_end|>``.

A server that cannot return prompt log-probabilities (the OpenAI API, llama.cpp, a vLLM without
the field, a server refusing token-id prompts) is found by a first one-token request and refused
with one line (`PromptLogprobsUnsupported`), never given a wrong number. A request that still
fails after its retries leaves its steps unscored (``likelihood_skipped`` names the reason).
Torch-free.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from audit.likelihood_probe import Scores, Scoring, run_likelihood_probe
from audit.probe_cli import probe_options
from envace.core.errors import EXIT_USAGE, UsageError
from envace.core.text import terminal_safe
from envace.evaluation.likelihood import Passes, Window, likelihood_exit, plan_windows
from envace.model.chat import IM_END, IM_START, marker_id
from envace.model.endpoint import EndpointClient, EndpointError
from envace.model.tokenizer_train import check_chat_tokens

NEG_INF = -9999.0  # how vLLM sends a log-probability of -inf


class PromptLogprobsUnsupported(EndpointError):
    """The server does not return prompt log-probabilities: no likelihood audit through it."""


def _unsupported(client: EndpointClient, why: str) -> PromptLogprobsUnsupported:
    return PromptLogprobsUnsupported(
        f"{client.base} cannot return prompt log-probabilities ({why}); the likelihood audit "
        "needs them (vLLM's `prompt_logprobs` on /v1/completions with a token-id prompt): serve "
        "the model with vLLM, or audit it locally with --model PATH")


def request_body(client: EndpointClient, ids: Sequence[int]) -> dict[str, Any]:
    """The completions request that returns every prompt token's log-probability."""
    return {"model": client.model, "prompt": list(ids), "max_tokens": 1, "temperature": 0,
            "prompt_logprobs": 0}


def token_logprobs(data: Any, ids: Sequence[int]) -> list[float | None]:
    """Each prompt token's log-probability from a completions answer (``None`` for the first
    token); `ValueError` naming what is missing or malformed."""
    try:
        entries = data["choices"][0]["prompt_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("the answer has no choices[0].prompt_logprobs") from None
    if not isinstance(entries, list):
        raise ValueError("choices[0].prompt_logprobs is missing or null")
    if len(entries) != len(ids):
        raise ValueError(f"{len(entries)} prompt log-probabilities for {len(ids)} prompt tokens")
    out: list[float | None] = []
    for k, (entry, tid) in enumerate(zip(entries, ids, strict=True)):
        if entry is None:
            if k:
                raise ValueError(f"no log-probability for prompt token {k}")
            out.append(None)
            continue
        got = entry.get(str(tid)) if isinstance(entry, dict) else None
        value = got.get("logprob") if isinstance(got, dict) else got
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or math.isnan(value) or value > 1e-6:
            raise ValueError(f"prompt token {k} (id {tid}) has no usable log-probability "
                             f"in {str(entry)[:120]}")
        out.append(-math.inf if value <= NEG_INF else float(value))
    return out


def check_prompt_logprobs(client: EndpointClient, tokenizer: Any) -> None:
    """One two-token request; `PromptLogprobsUnsupported` unless the answer carries the
    second token's log-probability."""
    ids = [marker_id(tokenizer, IM_START), marker_id(tokenizer, IM_END)]
    data, error, _ = client.post("/completions", request_body(client, ids))
    if data is None:
        raise _unsupported(client, f"a prompt_logprobs request failed: {error}")
    try:
        token_logprobs(data, ids)
    except ValueError as exc:
        raise _unsupported(client, str(exc)) from None


class EndpointScorer:
    """A served model as the likelihood audit's ``score_batch``: each window one request, at
    most ``concurrency`` in flight."""

    def __init__(self, client: EndpointClient, tokenizer: Any, context: int,
                 concurrency: int = 4) -> None:
        self.client, self.tokenizer, self.context = client, tokenizer, context
        self.concurrency = concurrency
        self.passes = Passes()
        self.requests = 0
        self.failed: Counter[str] = Counter()

    def _one(self, window: Window) -> list[tuple[int, float, int]] | str:
        data, error, _ = self.client.post("/completions", request_body(self.client, window.ids))
        if data is None:
            return f"server: {error}"
        try:
            lps = token_logprobs(data, window.ids)
        except ValueError as exc:
            return f"server: {exc}"
        out = []
        for step, start, end in window.spans:
            vals = lps[start:end]
            if any(v is None or not math.isfinite(v) for v in vals):
                return "server: a scored token has log-probability -inf"
            out.append((step, -float(sum(vals)), end - start))  # type: ignore[arg-type]
        return out

    def __call__(self, scorings: list[Scoring]) -> list[Scores]:
        todo, results = plan_windows(self.tokenizer, scorings, self.context, self.passes)
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            got = list(pool.map(self._one, [w for _, w in todo]))
        self.requests += len(todo)
        for (t, w), res in zip(todo, got, strict=True):
            if isinstance(res, str):
                self.failed[res[:120]] += 1
                for step, _s, _e in w.spans:
                    results[t][step] = res
                continue
            for step, nats, tokens in res:
                results[t][step] = (nats, tokens)
        return results

    def block(self) -> dict[str, Any]:
        """The summary's ``likelihood_scorer`` block."""
        c = self.client
        return {"kind": "endpoint", "url": c.base, "model": c.model,
                "request": "POST /completions, prompt = token ids, prompt_logprobs 0, "
                           "max_tokens 1, temperature 0",
                "concurrency": self.concurrency, "timeout_s": c.timeout_s,
                "retries": c.retries, "requests": self.requests,
                "failed_requests": sum(self.failed.values()),
                "failed_reasons": dict(self.failed.most_common()),
                "passes": self.passes.block()}


def probe_endpoint_likelihood(
    client: EndpointClient,
    tokenizer: Any,
    inputs: Sequence[str],
    out_dir: str | Path,
    opts: Any,
    context: int,
    concurrency: int = 4,
    limit: int = 0,
) -> dict[str, Any]:
    """The likelihood audit of a served model (checked first: `PromptLogprobsUnsupported`
    when it cannot return prompt log-probabilities); the summary."""
    check_prompt_logprobs(client, tokenizer)
    scorer = EndpointScorer(client, tokenizer, context, concurrency)
    return run_likelihood_probe(inputs, out_dir, scorer, opts, limit, label=client.label,
                                extra=lambda: {"likelihood_scorer": scorer.block()})


def served_cut(tokenizer: str, context: int | None = None) -> tuple[Any, int]:
    """``(tokenizer, context)`` of a served model from a local folder or preset holding its
    tokenizer: ``context`` checked against the folder's positions, else its default as the
    in-process probe's (`envace.model.models.context_length`); the tokenizer checked to encode
    the ChatML markers as single tokens. UsageError, one line, if any of it cannot be."""
    from transformers import AutoTokenizer  # heavy: only once a tokenizer is wanted

    # lazy: the model loaders load torch: kept out of the served path's import
    from envace.model.models import (
        context_length,
        context_problem,
        default_cache_dir,
        resolve_model,
    )

    try:
        path = resolve_model(tokenizer, default_cache_dir())
    except (ValueError, FileNotFoundError) as exc:
        raise UsageError(f"no tokenizer for the served model at {tokenizer} ({exc}): give "
                         "--tokenizer PATH (its prompts go to the server as token ids)") from None
    why = context_problem(context, path)
    if why:
        raise UsageError(why)
    try:
        tok = AutoTokenizer.from_pretrained(path)
        check_chat_tokens(tok)
    except (OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"cannot use the tokenizer at {path}: {first}") from None
    return tok, context or context_length(path)


def served_tokenizer(args: Any, prog: str) -> tuple[Any, int] | None:
    """`served_cut` of ``--tokenizer`` (else ``--model``) and ``--context``, or None after one
    line on stderr."""
    try:
        return served_cut(getattr(args, "tokenizer", None) or args.model,
                          getattr(args, "context", None))
    except UsageError as exc:
        print(f"{prog}: {terminal_safe(str(exc))}", file=sys.stderr)
        return None


def run_endpoint_likelihood_cli(args: Any) -> int:
    """`envace probe --likelihood --endpoint URL --model NAME [--tokenizer PATH]`; the exit
    code (2, one line, nothing written, when the server cannot return prompt log-probabilities)."""
    prog = getattr(args, "prog", "envace probe")
    served = served_tokenizer(args, prog)
    if served is None:
        return EXIT_USAGE
    tokenizer, context = served
    try:
        client = EndpointClient(args.endpoint, args.model, timeout_s=args.timeout,
                                retries=args.retries)
        client.check()
        summary = probe_endpoint_likelihood(client, tokenizer, list(args.inputs), args.out,
                                            probe_options(args, progress=not args.quiet),
                                            context, args.concurrency, args.limit)
    except (ValueError, EndpointError) as exc:
        print(f"{prog}: {terminal_safe(str(exc))}; nothing written", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"{prog}: {terminal_safe(str(exc))}; nothing written", file=sys.stderr)
        return EXIT_USAGE
    return likelihood_exit(args, summary, f" on {client.label}")
