"""The teacher-forced probe of a served world model: `envace probe --endpoint URL --model NAME`.

    envace probe --endpoint http://127.0.0.1:8000/v1 --model smollm2 dev.jsonl --out probe_out \
        [--concurrency 4] [--timeout 60] [--retries 3] [--api completions|chat]

Three passes, as the in-process probe (`envace.cli.probe.probe_model`): the trajectories are
replayed once to collect every request (`envace.model.endpoint.request_for`, the real history up to
each call), the requests are sent to the server with at most `concurrency` in flight, and a
second replay audits the answers in the order they were asked. A request that still fails after
its retries is recorded as an unanswered step with `unanswered_reason`; the summary names the
model `endpoint:<URL>#<model>` (`audited_model`) and carries an `endpoint` block (URL, model,
api, sampling, retries, how many requests failed and why). Torch-free.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from audit.probe import run_probe
from envace.core.worldmodel import Unanswered
from envace.model.endpoint import Answer, EndpointClient, request_for


class _Requests:
    """Pass 1: records each step's request, answers a placeholder."""

    def __init__(self, api: str) -> None:
        self.api, self.requests = api, []  # type: list[dict[str, Any]]

    def __call__(self, messages: list[dict], tools: Any, tool: str, arguments: dict) -> str:
        self.requests.append(request_for(messages, tools, tool, arguments, self.api))
        return ""


class _Replies:
    """Pass 2: answers in the order pass 1 asked; a failed request raises `Unanswered`."""

    def __init__(self, answers: Sequence[Answer]) -> None:
        self.answers, self.i = answers, 0

    def __call__(self, messages: list[dict], tools: Any, tool: str, arguments: dict) -> str:
        ans = self.answers[self.i]
        self.i += 1
        if ans.text is None:
            raise Unanswered(ans.error or "no answer")
        return ans.text


def endpoint_block(client: EndpointClient, answers: Sequence[Answer],
                   concurrency: int) -> dict[str, Any]:
    """The summary's `endpoint` block: where, how, and what failed."""
    failed = [a for a in answers if a.text is None]
    reasons = Counter((a.error or "no answer").split(": ", 1)[0] for a in failed)
    return {"url": client.base, "model": client.model, "api": client.api,
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
) -> dict[str, Any]:
    """Teacher-forced audit of a served model over trajectory files; the summary."""
    recorder = _Requests(client.api)
    quiet = dataclasses.replace(opts, plots=False, progress=False, reference=None)
    with tempfile.TemporaryDirectory() as scratch:
        run_probe(inputs, scratch, recorder, quiet, limit, steps=steps)
    total = len(recorder.requests)
    answers = client.answer_all(recorder.requests, concurrency,
                                None if progress is None else lambda n: progress(n, total))
    block = endpoint_block(client, answers, concurrency)
    return run_probe(inputs, out_dir, _Replies(answers), opts, limit, label=client.label,
                     steps=steps, extra={"endpoint": block})


def _progress(done: int, total: int) -> None:
    if done == total or done % max(1, total // 20) == 0:
        print(f"\rasked {done}/{total}", end="\n" if done == total else "", file=sys.stderr,
              flush=True)
