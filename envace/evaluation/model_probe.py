"""The model side of the probe: a local model as a world model (batched, greedy) and as an actor,
probed one step at a time on real histories. `envace probe` (`envace.cli.probe`) is its command.

    summary = probe_model(model, tok, ["dev.jsonl"], "probe_out", AuditOptions(), context,
                          histories=("real", "own"))
    rows = act_probe(model, tok, trajectories, steps, context)        # the actor's counterpart

Locally the model rehearses every tool call of the input trajectories (`audit.probe`), greedily,
until `<|im_end|>` or the token limit. By default each trajectory's KV cache is kept across its
calls and the trajectories are streamed (`kept_answers`: a trajectory's next request is generated
as soon as its answer ends, batched continuously with the others); with ``--no-prefix-cache``,
a memory, a hybrid or confidence they are probed in rounds (`audit.probe.probe_batched`) and
each round's prompts are generated together in length-sorted batches. Prompts are cut as the
SFT windows are (`envace.model.windows.prompt_ids`) to the model's context length: the
`seq_len` it was fine-tuned with (`envace_sft.json`), else `DEFAULT_CONTEXT` tokens.

`act_probe` (used by `experiments/presets.py`): given the real history up to a ground-truth call,
the model writes the assistant turn; the probe says whether a call parsed and whether it is the
ground-truth call (same name, same arguments up to int/float spelling). """

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from audit.probe import HISTORY_CHOICES, run_probe
from audit.probe_cli import finish, load_grounding, probe_options
from audit.worlds.memory import note_chars
from envace.core.errors import EXIT_USAGE, UsageError
from envace.core.text import terminal_safe
from envace.evaluation.likelihood import with_confidence
from envace.model.chat import IM_END, encode_text, parse_assistant
from envace.model.models import (
    auto_threads,
    context_length,
    context_problem,
    default_cache_dir,
    load_model_or_say,
    resolve_model,
)
from envace.model.windows import prompt_budget, prompt_ids

#: conversations probed at once on the kept-cache path (a trajectory under one history; its
#: cache is held while it lasts, and the next trajectory starts when one ends:
#: `audit.probe_stream`; SmolLM2-135M, fp32: about 46 KB per token, ~50 MB per BFCL dev
#: trajectory)
PREFIX_CHUNK = 32


def generate_greedy(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    batch_size: int = 8,
) -> list[str]:
    """Greedy continuations of token-id prompts, each cut at its first `<|im_end|>`.

    Prompts are left-padded and batched in order of length; outputs come back in input order.
    """
    import torch

    stop = tokenizer.convert_tokens_to_ids(IM_END)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop
    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[str] = [""] * len(prompts)
    model.eval()
    for a in range(0, len(order), batch_size):
        idx = order[a:a + batch_size]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            p = list(prompts[i])
            ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[row, width - len(p):] = 1
        with torch.no_grad():
            gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=stop, pad_token_id=pad)
        for row, i in enumerate(idx):
            new = gen[row, width:].tolist()
            if stop in new:
                new = new[: new.index(stop)]
            out[i] = tokenizer.decode(new, skip_special_tokens=False)
    return out


# ---------------------------------------------------------------- rehearsal (the world model)


def _section(timer: Any, name: str) -> Any:
    return timer.section(name) if timer is not None else contextlib.nullcontext()


def model_answers(model: Any, tokenizer: Any, context: int, max_new_tokens: int = 256,
                  batch_size: int = 8, timer: Any = None) -> Callable[[list[Any]], list[str]]:
    """A local model as a batch world model (`audit.probe.BatchAnswer`): each request's prompt
    is cut as the SFT windows are (`prompt_ids`) and a round's prompts are generated greedily
    together, in length-sorted batches of `batch_size`, each encoded from scratch (the per-step
    path). `timer` (anything with a `section(name)` context): each round's generation is a
    ``probe/generate`` section."""
    budget = prompt_budget(context, max_new_tokens)

    def answer(requests: list[Any]) -> list[str]:
        prompts = [prompt_ids(tokenizer, messages, tools, "tool", budget)
                   for messages, tools, _tool, _args in requests]
        with _section(timer, "probe/generate"):
            return generate_greedy(model, tokenizer, prompts, max_new_tokens, batch_size)

    return answer


def kept_answers(model: Any, tokenizer: Any, context: int, max_new_tokens: int = 256,
                 batch_size: int = 8, timer: Any = None) -> Callable[..., list[str]]:
    """`model_answers` over kept KV caches (`envace.model.kept_prompts`): a keyed
    `audit.probe.BatchAnswer` that keeps each trajectory's cache between its calls, so a
    step's prompt (cut as `model_answers` cuts it) encodes only what the trajectory's previous
    prompt and answer did not already hold: the previous answer is dropped, the real (or, history
    "own", the model's own) response and the next assistant message are appended. A prompt cut
    to the context differs from the kept one early and is encoded again from there, as on the
    per-step path. Same greedy answers as `model_answers` up to float summation order. Its
    ``stream`` (used by `audit.probe_stream`) asks without rounds: each trajectory's next
    request is generated as soon as its previous answer ends, and a trajectory that starts
    (``more``) joins as soon as another has ended (`KeptPrompts.stream`); the probe's own work
    (advancing a trajectory, starting one) is timed as ``probe/advance`` inside
    ``probe/generate``."""
    import torch

    # lazy: loads torch: kept out of --help
    from envace.model.kept_prompts import KeptPrompts

    budget = prompt_budget(context, max_new_tokens)
    stop = tokenizer.convert_tokens_to_ids(IM_END)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop
    kept = KeptPrompts(model, pad, stop, batch_size, decode_threads=torch.get_num_threads())

    def answer(requests: list[Any], keys: list[Any]) -> list[str]:
        prompts = [prompt_ids(tokenizer, messages, tools, "tool", budget)
                   for messages, tools, _tool, _args in requests]
        with _section(timer, "probe/generate"):
            gens = kept.generate(keys, prompts, max_new_tokens)
        return [tokenizer.decode(g, skip_special_tokens=False) for g in gens]

    def stream(first: list[tuple[Any, Any]], answered: Callable[[Any, str], Any],
               more: Callable[[], list[tuple[Any, Any]]] | None = None) -> None:
        def ids(request: Any) -> list[int]:
            return prompt_ids(tokenizer, *request[:2], "tool", budget)

        def next_of(key: Any, out: list[int]) -> list[int] | None:
            with _section(timer, "probe/advance"):  # the probe's own work, not generation
                request = answered(key, tokenizer.decode(out, skip_special_tokens=False))
            return None if request is None else ids(request)

        def started() -> list[tuple[Any, list[int]]]:
            assert more is not None
            with _section(timer, "probe/advance"):  # trajectories that start: replayed first
                return [(key, ids(r)) for key, r in more()]

        with _section(timer, "probe/generate"):
            kept.stream([(key, ids(r)) for key, r in first], next_of, max_new_tokens,
                        None if more is None else started)

    answer.keyed = True  # type: ignore[attr-defined]
    answer.kept = kept  # type: ignore[attr-defined]
    answer.stream = stream  # type: ignore[attr-defined]
    return answer


def sequence_logprobs(model: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
                      batch_size: int = 8, pad: int = 0) -> list[float]:
    """For each `(prompt, continuation)` of token ids, the model's summed log-probability of
    the continuation after the prompt (teacher-forced, fp32 log-softmax); right-padded batches
    in order of length, results in input order."""
    import torch

    # lazy: loads torch: only this path needs it
    from envace.model.trained_logits import selected_logits

    device = next(model.parameters()).device
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
    out = [0.0] * len(pairs)
    model.eval()
    for a in range(0, len(order), batch_size):
        idx = [i for i in order[a:a + batch_size] if len(pairs[i][1]) > 0]
        if not idx:
            continue
        width = max(len(pairs[i][0]) + len(pairs[i][1]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        attn = torch.zeros((len(idx), width), dtype=torch.long)
        sel = torch.zeros((len(idx), width - 1), dtype=torch.bool)
        for row, i in enumerate(idx):
            prompt, cont = list(pairs[i][0]), list(pairs[i][1])
            seq = prompt + cont
            ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
            attn[row, :len(seq)] = 1
            sel[row, len(prompt) - 1:len(seq) - 1] = True
        targets = ids[:, 1:][sel].to(device)
        with torch.no_grad():
            logits = selected_logits(model, ids.to(device), attn.to(device), sel.to(device))
            lp = torch.log_softmax(logits.float(), dim=-1).gather(1, targets[:, None])[:, 0]
        sums = torch.split(lp.cpu(), sel.sum(dim=1).tolist())
        for row, i in enumerate(idx):
            out[i] = float(sums[row].sum())
    return out


def response_scorer(model: Any, tokenizer: Any, context: int, max_new_tokens: int = 256,
                    batch_size: int = 8) -> Callable[[list[Any], list[list[str]]],
                                                     list[list[float | None]]]:
    """A local model as the scorer of a choosing world model (`audit.worlds.choice`): each candidate
    response's log-probability (its ids, then `<|im_end|>`) after the request's prompt, cut as
    `model_answers` cuts it; None for a candidate longer than `max_new_tokens` tokens before
    its `<|im_end|>` (the model could not have written it)."""
    budget = prompt_budget(context, max_new_tokens)
    stop = tokenizer.convert_tokens_to_ids(IM_END)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop

    def score(requests: list[Any], cands: list[list[str]]) -> list[list[float | None]]:
        pairs: list[tuple[list[int], list[int]]] = []
        where: list[tuple[int, int]] = []
        out: list[list[float | None]] = [[None] * len(c) for c in cands]
        for r, ((messages, tools, _tool, _args), texts) in enumerate(
                zip(requests, cands, strict=True)):
            prompt = prompt_ids(tokenizer, messages, tools, "tool", budget)
            for j, text in enumerate(texts):
                cont = encode_text(tokenizer, text) + [stop]
                if len(cont) <= max_new_tokens + 1:
                    pairs.append((prompt, cont))
                    where.append((r, j))
        for (r, j), value in zip(where, sequence_logprobs(model, pairs, batch_size, pad),
                                 strict=True):
            out[r][j] = value
        return out

    return score


def probe_model(
    model: Any,
    tokenizer: Any,
    inputs: Sequence[str],
    out_dir: str | Path,
    opts: Any,
    context: int,
    max_new_tokens: int = 256,
    limit: int = 0,
    steps: Mapping[str, Iterable[int]] | None = None,
    label: str | None = None,
    batch_size: int = 8,
    histories: Sequence[str] = ("real",),
    grounding: Any = None,
    prefix_cache: bool = True,
    timer: Any = None,
    confidence: bool = False,
) -> dict[str, Any]:
    """The probe of a local model over trajectory files (teacher-forced with ``("real",)``,
    self-conditioned with ``("own",)``, both decomposed with both), generation batched over
    the trajectories' requests (streamed on the kept path, round by round otherwise); the
    summary. `grounding` (an
    `audit.worlds.memory.MemoryOptions`): the model shown a memory of real responses and/or in the
    hybrid with a lookup; the label names it and the summary gains the `world_model` block.
    `prefix_cache` (without grounding): each trajectory's KV cache is kept across its calls
    (`kept_answers`, `PREFIX_CHUNK` trajectories at a time); False: every prompt is encoded
    from scratch (`model_answers`, the per-step path). `timer`: see `model_answers`.
    `confidence`: each answer is also scored after its prompt (one more forward per call, on
    the per-step path), so the rows gain `confidence` and the summary its `confidence` block
    (`audit.stats.confidence`)."""
    if confidence:  # each answer scored after its prompt: rows gain `confidence`
        base = with_confidence(model, tokenizer, context, max_new_tokens,
                               model_answers(model, tokenizer, context, max_new_tokens,
                                             batch_size, timer), batch_size)
    elif prefix_cache and (grounding is None or not grounding.active):
        kept = kept_answers(model, tokenizer, context, max_new_tokens, batch_size, timer)
        return run_probe(inputs, out_dir, None, opts, limit, label=label, steps=steps,
                         histories=histories, answer_batch=kept, chunk=PREFIX_CHUNK)
    else:
        base = model_answers(model, tokenizer, context, max_new_tokens, batch_size, timer)
    if grounding is None or not grounding.active:
        return run_probe(inputs, out_dir, None, opts, limit, label=label, steps=steps,
                         histories=histories, answer_batch=base)
    if getattr(grounding, "choose", None) is not None and grounding.scorer is None:
        grounding = replace(grounding, scorer=response_scorer(model, tokenizer, context,
                                                              max_new_tokens, batch_size))
    answer, block = grounding.wrap(base)
    return run_probe(inputs, out_dir, None, opts, limit, label=grounding.label(str(label)),
                     steps=steps, histories=histories, answer_batch=answer, task_ids=True,
                     extra=block)


def run_model_probe(args: Any) -> int:
    """`envace probe --model PATH` (`args`: its namespace, `envace.cli.probe`): the audit of a
    local model, greedy and batched; the exit code."""
    prog = getattr(args, "prog", "envace probe")
    try:
        grounding = load_grounding(args)
        path = resolve_model(args.model, default_cache_dir())
    except (ValueError, FileNotFoundError, UsageError) as exc:
        print(f"{prog}: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    why = context_problem(getattr(args, "context", None), path)
    if why:
        print(f"{prog}: {why}", file=sys.stderr)
        return EXIT_USAGE
    import torch  # lazy: this module is imported by `envace probe --help`, which needs no torch

    torch.set_num_threads(auto_threads())
    loaded = load_model_or_say(path, prog)
    if loaded is None:
        return EXIT_USAGE
    model, tokenizer = loaded
    opts = probe_options(args, progress=not args.quiet)
    context = getattr(args, "context", None) or context_length(path, model)
    # the note takes at most one character per token of the prompt budget (audit.worlds.memory)
    budget = prompt_budget(context, args.max_new_tokens)
    grounding = replace(grounding, max_chars=note_chars(budget))
    try:
        summary = probe_model(model, tokenizer, list(args.inputs), args.out, opts, context,
                              args.max_new_tokens, args.limit, label=str(path),
                              histories=HISTORY_CHOICES[args.history], grounding=grounding,
                              prefix_cache=not getattr(args, "no_prefix_cache", False),
                              confidence=bool(getattr(args, "confidence", False)))
    except UsageError as exc:  # a refused --out: one line and 2, as documented
        print(f"{prog}: {terminal_safe(str(exc))}; nothing written", file=sys.stderr)
        return EXIT_USAGE
    return finish(args, summary)


# ---------------------------------------------------------------- acting


def _norm(value: Any) -> Any:
    """Arguments compared up to key order, int/float spelling (5 == 5.0) and tuple/list."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _norm(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_norm(v) for v in value]
    return value


def same_call(name: str, arguments: Any, gt_name: str, gt_arguments: Any) -> bool:
    """Whether a parsed call is the ground-truth call."""
    return name == gt_name and _norm(arguments) == _norm(gt_arguments or {})


def act_requests(trajectories: Sequence[Any], steps: Mapping[str, Iterable[int]]
                 ) -> list[dict[str, Any]]:
    """For each chosen step of real trajectories: the history before its call and the call."""
    out = []
    for traj in trajectories:
        wanted = set(steps.get(traj.id, ()))
        if not wanted:
            continue
        for st in traj.tool_steps():
            if st.step not in wanted:
                continue
            history = [m.dump() for m in traj.messages[: st.message_index]]
            out.append({"trajectory_id": traj.id, "step": st.step, "messages": history,
                        "tools": traj.tools, "tool": st.tool, "arguments": st.arguments})
    return out


def act_probe(
    model: Any,
    tokenizer: Any,
    requests: Sequence[Mapping[str, Any]],
    context: int,
    max_new_tokens: int = 128,
    batch_size: int = 8,
) -> list[dict[str, Any]]:
    """Generate each request's assistant turn; report the parse and the agreement per step."""
    budget = prompt_budget(context, max_new_tokens)
    prompts = [prompt_ids(tokenizer, r["messages"], r["tools"], "assistant", budget)
               for r in requests]
    texts = generate_greedy(model, tokenizer, prompts, max_new_tokens, batch_size)
    rows = []
    for r, text in zip(requests, texts, strict=True):
        turn = parse_assistant(text)
        first = turn.calls[0] if turn.calls else None
        rows.append({
            "trajectory_id": r["trajectory_id"], "step": r["step"],
            "generated": text,
            "parsed_call": first is not None,
            "malformed": len(turn.malformed),
            "name_match": first is not None and first.name == r["tool"],
            "exact_call": first is not None and same_call(first.name, first.arguments,
                                                          r["tool"], r["arguments"]),
        })
    return rows


# ---------------------------------------------------------------- the CLI entry
