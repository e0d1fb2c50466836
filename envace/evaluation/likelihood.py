"""The model side of the likelihood audit: one teacher-forced forward per real trajectory.

    summary = probe_likelihood(model, tok, ["dev.jsonl"], "lk_out", AuditOptions(), context)

Each trajectory (its tool messages holding the real responses, ``audit.likelihood_probe``) is
encoded once as the chat format renders it (``envace.model.chat.encode_with_roles``) with every
tool response tokenized as a rehearsing model writes it: after the ``<|im_start|>tool\\n`` header,
on its own, then ``<|im_end|>`` (the token stream of a rollout; with the tiny tokenizer, and with
SmolLM2's unless a response starts with whitespace, the same ids as the probe's prompts). The
scored tokens of a step are that response's tokens and its ``<|im_end|>``.

**One pass per trajectory** where the whole encoding fits ``context`` tokens: every response is
scored by the same forward, each given everything before it. **One window per call** where it
does not: the prompt the generation probe shows for that call, cut as it cuts prompts
(``envace.model.windows.prompt_ids``: the system turn, the last user message when it falls
outside, as many of the latest messages as fit) to ``context`` minus the response's tokens, then
the response. So every step's figure is that of an independent forward over its own prompt and
response (tested); a window holding several calls would show the later ones less history than
the probe does. A response that alone does not fit ``context`` is not scored
(``likelihood_skipped``). Windows (of all the chunk's
trajectories) run in length-sorted, right-padded batches; the log-softmax is fp32, taken only
at the scored positions (``envace.model.trained_logits.selected_logits``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit.likelihood_probe import Scores, Scoring, run_likelihood_probe
from audit.probe_cli import probe_options
from audit.stats.confidence import Rehearsal
from envace.core.errors import EXIT_OK, EXIT_SKIPPED, EXIT_USAGE, UsageError
from envace.core.text import terminal_safe
from envace.model.chat import IM_END, Role, encode_text, marker_id
from envace.model.models import (
    auto_threads,
    context_length,
    context_problem,
    default_cache_dir,
    load_model_or_say,
    resolve_model,
)
from envace.model.windows import message_blocks, prompt_budget, prompt_ids

TOO_LONG = "the response alone is longer than the context"


@dataclass
class Window:
    """Token ids to run, and the scored spans: ``(step, start, end)``, ids[start:end] scored."""

    ids: list[int]
    spans: list[tuple[int, int, int]]


@dataclass
class Passes:
    """What the scorer ran (the summary's ``likelihood_scorer.passes``)."""

    trajectories: int = 0
    one_pass: int = 0  #: trajectories scored in a single forward
    windowed: int = 0  #: trajectories that needed windows
    windows: int = 0  #: forwards run (one per window)
    tokens: int = 0  #: tokens forwarded
    scored_tokens: int = 0
    unscored_steps: int = 0
    context: int = 0

    def block(self) -> dict[str, Any]:
        return dict(vars(self))


def _for_encoding(messages: Sequence[dict[str, Any]], targets: dict[int, int]
                  ) -> list[dict[str, Any]]:
    """The messages with each scored tool message marked as written by the model, so that its
    text is tokenized on its own after the header (the ids a rehearsing model writes)."""
    marked = {i for i in targets.values()}
    return [dict(m, rehearsed=True) if i in marked else dict(m) for i, m in enumerate(messages)]


def trajectory_windows(tokenizer: Any, scoring: Scoring, context: int
                       ) -> tuple[list[Window], dict[int, str]]:
    """The windows that score ``scoring``'s responses, and the steps that cannot be scored."""
    msgs = _for_encoding(scoring.messages, scoring.targets)
    blocks, _ = message_blocks(tokenizer, msgs, scoring.tools, measuring=True)
    off = 0 if msgs and msgs[0].get("role") == "system" else 1
    block_of = {step: i + off for step, i in scoring.targets.items()}
    # within its block, a response's scored ids are those the format marks as rehearsed
    span_in: dict[int, tuple[int, int]] = {}
    for step, b in block_of.items():
        roles = blocks[b][1]
        where = [k for k, r in enumerate(roles) if r == Role.REHEARSE]
        span_in[step] = (where[0], where[-1] + 1)
    starts, pos = [], 0
    for ids, _ in blocks:
        starts.append(pos)
        pos += len(ids)
    order = sorted(block_of, key=lambda s: block_of[s])
    if pos <= context:
        ids = [t for b, _ in blocks for t in b]
        spans = [(s, starts[block_of[s]] + span_in[s][0], starts[block_of[s]] + span_in[s][1])
                 for s in order]
        return [Window(ids, spans)], {}
    windows: list[Window] = []
    skipped: dict[int, str] = {}
    for step in order:
        b = block_of[step]
        a, e = span_in[step]
        if e - a >= context:
            skipped[step] = TOO_LONG
            continue
        prefix = prompt_ids(tokenizer, msgs[:scoring.targets[step]], scoring.tools, "tool",
                            context - (e - a))
        n = len(prefix)
        windows.append(Window(prefix + blocks[b][0][a:e], [(step, n, n + e - a)]))
    return windows, skipped


def score_windows(model: Any, windows: Sequence[Window], batch_size: int = 4,
                  pad: int = 0) -> list[list[tuple[int, float, int, float]]]:
    """For each window, each span's ``(step, nats, tokens, lowest)``: minus the summed fp32
    log-probability of ``ids[start:end]`` after ``ids[:start]``, and its lowest token
    log-probability. Length-sorted batches."""
    import torch

    # lazy: loads torch: kept out of --help
    from envace.model.trained_logits import selected_logits

    device = next(model.parameters()).device
    order = sorted(range(len(windows)), key=lambda i: len(windows[i].ids))
    out: list[list[tuple[int, float, int, float]]] = [[] for _ in windows]
    model.eval()
    for a in range(0, len(order), batch_size):
        idx = [i for i in order[a:a + batch_size] if windows[i].spans]
        if not idx:
            continue
        width = max(len(windows[i].ids) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        attn = torch.zeros((len(idx), width), dtype=torch.long)
        sel = torch.zeros((len(idx), width - 1), dtype=torch.bool)
        for row, i in enumerate(idx):
            w = windows[i]
            ids[row, :len(w.ids)] = torch.tensor(w.ids, dtype=torch.long)
            attn[row, :len(w.ids)] = 1
            for _s, start, end in w.spans:
                sel[row, start - 1:end - 1] = True  # row t predicts token t + 1
        targets = ids[:, 1:][sel].to(device)
        with torch.no_grad():
            logits = selected_logits(model, ids.to(device), attn.to(device), sel.to(device))
            lp = torch.log_softmax(logits.float(), dim=-1).gather(1, targets[:, None])[:, 0]
        per_row = torch.split(lp.double().cpu(), sel.sum(dim=1).tolist())
        for row, i in enumerate(idx):
            vals, k = per_row[row], 0
            for s, start, end in sorted(windows[i].spans, key=lambda sp: sp[1]):
                n = end - start
                out[i].append((s, -float(vals[k:k + n].sum()), n, float(vals[k:k + n].min())))
                k += n
    return out


def plan_windows(tokenizer: Any, scorings: Sequence[Scoring], context: int, passes: Passes
                 ) -> tuple[list[tuple[int, Window]], list[dict[int, Any]]]:
    """Every window of a chunk's trajectories with its trajectory's index, and each
    trajectory's unscorable steps (with why); counted in ``passes``."""
    passes.context = context
    todo: list[tuple[int, Window]] = []
    results: list[dict[int, Any]] = []
    for t, sc in enumerate(scorings):
        wins, skipped = trajectory_windows(tokenizer, sc, context)
        passes.trajectories += 1
        if len(wins) == 1 and not skipped:
            passes.one_pass += 1
        elif sc.targets:
            passes.windowed += 1
        passes.windows += len(wins)
        passes.tokens += sum(len(w.ids) for w in wins)
        passes.scored_tokens += sum(e - s for w in wins for _, s, e in w.spans)
        passes.unscored_steps += len(skipped)
        results.append(dict(skipped))
        todo.extend((t, w) for w in wins)
    return todo, results


@dataclass
class ModelScorer:
    """A local model as the likelihood audit's ``score_batch`` (``audit.likelihood_probe``)."""

    model: Any
    tokenizer: Any
    context: int
    batch_size: int = 4
    passes: Passes = field(default_factory=Passes)

    def __call__(self, scorings: list[Scoring]) -> list[Scores]:
        todo, results = plan_windows(self.tokenizer, scorings, self.context, self.passes)
        stop = marker_id(self.tokenizer, IM_END)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else stop
        got = score_windows(self.model, [w for _, w in todo], self.batch_size, pad)
        for (t, _), spans in zip(todo, got, strict=True):
            for step, nats, tokens, _lowest in spans:
                results[t][step] = (nats, tokens)
        return results


def probe_likelihood(
    model: Any,
    tokenizer: Any,
    inputs: Sequence[str],
    out_dir: str | Path,
    opts: Any,
    context: int,
    limit: int = 0,
    label: str | None = None,
    batch_size: int = 4,
) -> dict[str, Any]:
    """The likelihood audit of a local model over real trajectory files; the summary (its
    ``likelihood`` block, and ``likelihood_scorer``: the context and the passes run)."""
    scorer = ModelScorer(model, tokenizer, context, batch_size)

    def extra() -> dict[str, Any]:
        return {"likelihood_scorer": {"kind": "local", "dtype": "fp32 log-softmax",
                                      "batch_size": batch_size, "passes": scorer.passes.block()}}

    return run_likelihood_probe(inputs, out_dir, scorer, opts, limit, label=label, extra=extra)


def with_confidence(model: Any, tokenizer: Any, context: int, max_new_tokens: int,
                    answer: Any, batch_size: int = 4) -> Any:
    """A batch world model (`audit.probe.BatchAnswer`) whose text answers come back as
    `audit.stats.confidence.Rehearsal`: each scored, teacher-forced, after the prompt it was
    generated from (cut as `model_answers` cuts it) with its end marker: the log-probability
    the model wrote it with, so the probe's rows get ``confidence`` (one extra forward per
    call; greedy decoding's token log-probabilities are these up to fp32 rounding)."""
    budget = prompt_budget(context, max_new_tokens)
    stop = marker_id(tokenizer, IM_END)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop

    def scored(requests: list[Any]) -> list[Any]:
        texts = answer(requests)
        windows, where = [], []
        for k, ((messages, tools, _tool, _args), text) in enumerate(
                zip(requests, texts, strict=True)):
            if not isinstance(text, str):
                continue
            prompt = prompt_ids(tokenizer, messages, tools, "tool", budget)
            cont = encode_text(tokenizer, text) + [stop]
            windows.append(Window(prompt + cont, [(k, len(prompt), len(prompt) + len(cont))]))
            where.append(k)
        out = list(texts)
        for k, spans in zip(where, score_windows(model, windows, batch_size, pad), strict=True):
            _s, nats, tokens, lowest = spans[0]
            out[k] = Rehearsal.of(str(texts[k]), -nats, tokens, lowest)
        return out

    return scored


def likelihood_line(summary: dict[str, Any], where: str) -> str:
    """The closing line of `envace probe --likelihood`."""
    lk = summary.get("likelihood") or {}
    c = summary["counts"]

    def shown(est: Any) -> str:
        point = (est or {}).get("point")
        if point is None:
            return "n/a"
        ci = est.get("ci")
        return f"{point:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")

    comp = lk.get("compressor")
    ref = f", primed deflate {shown(comp['bits_per_byte'])}" if comp else ""
    return (f"scored {lk.get('steps', 0)} of {c['steps']} calls of {c['trajectories']} "
            f"trajectories{where} (skipped {c['skipped']}): "
            f"{shown(lk.get('bits_per_byte'))} bits per byte{ref}")


def likelihood_exit(args: Any, summary: dict[str, Any], where: str = "") -> int:
    """Print the closing line (unless ``--quiet``); the exit code: 3 when a record was skipped
    or a call could not be scored (each named), else 0."""
    lk = summary.get("likelihood") or {}
    if not args.quiet:
        print(likelihood_line(summary, where) + f"; wrote {args.out}")
    if lk.get("not_scored"):
        print(f"{getattr(args, 'prog', 'envace probe')}: calls not scored: {lk['not_scored']} "
              "(likelihood_skipped in steps.jsonl)", file=sys.stderr)
    return EXIT_SKIPPED if summary["counts"]["skipped"] or lk.get("not_scored") else EXIT_OK


def run_likelihood_cli(args: Any) -> int:
    """`envace probe --likelihood --model PATH`: the likelihood audit of a local model; the
    exit code."""
    prog = getattr(args, "prog", "envace probe")
    try:
        path = resolve_model(args.model, default_cache_dir())
    except (ValueError, FileNotFoundError) as exc:
        print(f"{prog}: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    why = context_problem(getattr(args, "context", None), path)
    if why:
        print(f"{prog}: {why}", file=sys.stderr)
        return EXIT_USAGE
    import torch

    torch.set_num_threads(auto_threads())
    loaded = load_model_or_say(path, prog)
    if loaded is None:
        return EXIT_USAGE
    model, tokenizer = loaded
    context = getattr(args, "context", None) or context_length(path, model)
    try:
        summary = probe_likelihood(model, tokenizer, list(args.inputs), args.out,
                                   probe_options(args, progress=not args.quiet), context,
                                   args.limit, label=str(path))
    except UsageError as exc:
        print(f"{prog}: {terminal_safe(str(exc))}; nothing written", file=sys.stderr)
        return EXIT_USAGE
    return likelihood_exit(args, summary)
