"""The teacher-forced probe of a served world model: `envace probe --endpoint URL --model NAME`.

    envace probe --endpoint http://127.0.0.1:8000/v1 --model smollm2 dev.jsonl --out probe_out \
        [--concurrency 4] [--timeout 60] [--retries 3] [--api completions|chat]

As the in-process probe (`envace.evaluation.model_probe.probe_model`), the trajectories are probed
in rounds (`audit.probe.probe_batched`): each round sends every live trajectory's next request
(`envace.model.endpoint.request_for`: the real history up to the call, or with `--history own` the
model's own earlier answers) to the server with at most `concurrency` in flight. With the served
model's tokenizer (`--tokenizer PATH`, or `--context N` with a local `--model`; always with
`--confidence`) each prompt is the in-process probe's, cut to the context as SFT windows are, and
goes to `/v1/completions` as token ids: the served and the in-process probe ask the same
prompts, and a conversation longer than the server's context is answered, not refused. Without
it the whole conversation goes as text. A request that
still fails after its retries is recorded as an unanswered step with
`unanswered_reason`; the summary names the model `endpoint:<URL>#<model>` (`audited_model`)
and carries an `endpoint` block (URL, model, api, sampling, retries, how many requests failed
and why). Torch-free.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from audit.probe import HISTORY_CHOICES, run_probe
from audit.probe_cli import load_grounding, print_history, probe_options
from audit.worlds.memory import MemoryOptions, note_chars
from envace.core.errors import EXIT_OK, EXIT_SKIPPED, EXIT_USAGE, UsageError
from envace.core.layout import AUDIT
from envace.core.text import terminal_safe
from envace.core.worldmodel import Unanswered
from envace.evaluation.endpoint_confidence import ServedConfidence
from envace.evaluation.endpoint_likelihood import check_prompt_logprobs, served_tokenizer
from envace.model.endpoint import Answer, EndpointClient, EndpointError, request_for
from envace.model.windows import prompt_budget, prompt_ids


class _Asker:
    """A served model as a batch world model (`audit.probe.BatchAnswer`): a round's requests
    go to the server with at most `concurrency` in flight; a request that still fails after
    its retries answers `Unanswered`. Every answer is kept for the summary's endpoint block.
    ``cut``: ``(tokenizer, context)`` of the served model: each prompt is the in-process
    probe's (`envace.model.windows.prompt_ids`, cut to ``context - max_tokens`` tokens), sent as
    token ids; without it the whole conversation goes as text (`request_for`)."""

    def __init__(self, client: EndpointClient, concurrency: int,
                 progress: Callable[[int, int], None] | None,
                 cut: tuple[Any, int] | None = None) -> None:
        self.client, self.concurrency, self.progress = client, concurrency, progress
        self.cut = cut
        self.answers: list[Answer] = []

    def body(self, request: Any) -> dict[str, Any]:
        """The request body (less model and sampling) of one probe request."""
        messages, tools, tool, args = request
        if self.cut is None:
            return request_for(messages, tools, tool, args, self.client.api)
        tokenizer, context = self.cut
        budget = prompt_budget(context, self.client.max_tokens)  # as the in-process probe's
        return {"prompt": prompt_ids(tokenizer, messages, tools, "tool", budget)}

    def __call__(self, requests: list[Any]) -> list[str | Unanswered]:
        asked = [self.body(r) for r in requests]
        base = len(self.answers)
        report = None if self.progress is None else (lambda n: self.progress(base + n, -1))
        got = self.client.answer_all(asked, self.concurrency, report)
        self.answers.extend(got)
        return [a.text if a.text is not None else Unanswered(a.error or "no answer")
                for a in got]


def endpoint_block(client: EndpointClient, answers: Sequence[Answer], concurrency: int,
                   context: int | None = None) -> dict[str, Any]:
    """The summary's `endpoint` block: where, how (``prompt``: cut to ``context`` tokens and
    sent as token ids, or the whole conversation as text), and what failed."""
    prompt = (f"token ids, cut to {context} tokens as the in-process probe cuts them"
              if context is not None else "text, whole (a prompt past the server's context "
              "is refused by the server and its step unanswered)")
    failed = [a for a in answers if a.text is None]
    reasons = Counter((a.error or "no answer").split(": ", 1)[0] for a in failed)
    return {"url": client.base, "model": client.model, "api": client.api,
            "prompt": prompt,
            "temperature": 0, "max_tokens": client.max_tokens, "concurrency": concurrency,
            "timeout_s": client.timeout_s, "retries": client.retries,
            "requests": len(answers), "answered": len(answers) - len(failed),
            "unanswered": len(failed), "retried": sum(a.attempts > 1 for a in answers),
            "unanswered_reasons": dict(reasons.most_common())}


def probe_endpoint(
    client: EndpointClient,
    inputs: Sequence[str],
    out_dir: str | Path,
    opts: Any,
    concurrency: int = 4,
    limit: int = 0,
    steps: Mapping[str, Iterable[int]] | None = None,
    progress: Callable[[int, int], None] | None = None,
    histories: Sequence[str] = ("real",),
    grounding: MemoryOptions | None = None,
    confidence: tuple[Any, int] | None = None,
    cut: tuple[Any, int] | None = None,
) -> dict[str, Any]:
    """The probe of a served model over trajectory files (histories as `audit.probe.run_probe`
    takes them); the summary, with the `endpoint` block. `grounding`: the served model shown a
    memory of real responses and/or in the hybrid with a lookup (`audit.worlds.memory`; the summary
    names it and adds the `world_model` block). `confidence`: ``(tokenizer, context)`` of the
    served model: each answer scored on the server (`envace.evaluation.endpoint_confidence`;
    checked first: `PromptLogprobsUnsupported` when the server cannot). `cut`:
    ``(tokenizer, context)``: the prompts are cut as the in-process probe cuts them and sent as
    token ids, and a memory note is held to the in-process probe's characters (the scored
    prompts of `confidence` are these: given confidence, it cuts too)."""
    cut = cut or confidence
    if cut is not None and grounding is not None:  # the note cut as the in-process probe's
        grounding = replace(grounding, max_chars=note_chars(prompt_budget(cut[1],
                                                                          client.max_tokens)))
    asker = _Asker(client, concurrency, progress, cut)
    scored: ServedConfidence | None = None
    if confidence is not None:
        check_prompt_logprobs(client, confidence[0])
        scored = ServedConfidence(client, confidence[0], confidence[1], client.max_tokens, asker,
                                  concurrency)
    ask: Any = scored if scored is not None else asker

    def extra() -> dict[str, Any]:
        block = endpoint_block(client, asker.answers, concurrency,
                               None if cut is None else cut[1])
        return {"endpoint": {**block, **(scored.block() if scored is not None else {})}}

    if grounding is None or not grounding.active:
        return run_probe(inputs, out_dir, None, opts, limit, label=client.label, steps=steps,
                         histories=histories, answer_batch=ask, extra=extra)
    answer, block = grounding.wrap(ask)
    return run_probe(inputs, out_dir, None, opts, limit, label=grounding.label(client.label),
                     steps=steps, histories=histories, answer_batch=answer,  # type: ignore[arg-type]
                     task_ids=True, extra=lambda: {**extra(), **block()})


def _progress(done: int, total: int) -> None:
    """`asked N` on stderr (`total` < 0: not known in advance, the probe asks in rounds)."""
    if total < 0:
        if done % 20 == 0:
            print(f"\rasked {done}", end="", file=sys.stderr, flush=True)
        return
    if done == total or done % max(1, total // 20) == 0:
        print(f"\rasked {done}/{total}", end="\n" if done == total else "", file=sys.stderr,
              flush=True)


def run_endpoint_probe(args: Any) -> int:
    """`envace probe --endpoint URL --model NAME` (`args`: its namespace, `envace.cli.probe`):
    the audit of a served model; the exit code."""
    prog = getattr(args, "prog", "envace probe")
    try:
        grounding = load_grounding(args)
    except UsageError as exc:
        print(f"{prog}: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    try:
        client = EndpointClient(args.endpoint, args.model, api=args.api,
                                max_tokens=args.max_new_tokens, timeout_s=args.timeout,
                                retries=args.retries)
        client.check()
    except (ValueError, EndpointError) as exc:
        print(f"{prog}: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    opts = probe_options(args, progress=False)
    confidence = cut = None
    if getattr(args, "confidence", False):
        confidence = served_tokenizer(args, prog)
        if confidence is None:
            return EXIT_USAGE
    elif getattr(args, "tokenizer", None) or getattr(args, "context", None):
        cut = served_tokenizer(args, prog)
        if cut is None:
            return EXIT_USAGE
    try:
        summary = probe_endpoint(client, list(args.inputs), args.out, opts, args.concurrency,
                                 args.limit, progress=None if args.quiet else _progress,
                                 histories=HISTORY_CHOICES[getattr(args, "history", "real")],
                                 grounding=grounding, confidence=confidence, cut=cut)
    except UsageError as exc:  # a refused --out: one line and 2, as documented
        print(f"{prog}: {terminal_safe(str(exc))}; nothing written", file=sys.stderr)
        return EXIT_USAGE
    except EndpointError as exc:  # cannot return prompt log-probabilities (--confidence)
        print(f"{prog}: {terminal_safe(str(exc))}; nothing written", file=sys.stderr)
        return EXIT_USAGE
    c, block = summary["counts"], summary["endpoint"]
    if not args.quiet:
        rate = summary.get("divergence_rate")
        shown = f"{rate:.1%}" if isinstance(rate, float) else "n/a"
        print(f"probed {c['steps']} calls of {c['trajectories']} trajectories on "
              f"{client.label} (unanswered {block['unanswered']}, skipped {c['skipped']}): "
              f"divergence {shown}; wrote {args.out}")
        print_history(summary)
    if block["unanswered"]:
        print(f"{prog}: {block['unanswered']} of {block['requests']} requests failed "
              f"({block['unanswered_reasons']}); see unanswered_reason in {AUDIT.steps}",
              file=sys.stderr)
    return EXIT_SKIPPED if c["skipped"] or block["unanswered"] else EXIT_OK
