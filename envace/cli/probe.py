"""A model as a world model and as an actor, probed one step at a time on real histories.

    envace probe --model runs/sft-tiny dev.jsonl --out probe_out [--reference train.jsonl]
    envace probe --endpoint http://127.0.0.1:8000/v1 --model NAME dev.jsonl --out probe_out
    envace probe --model PATH dev.jsonl --out DIR --memory train.jsonl [--memory-k 3]
    envace probe --model PATH dev.jsonl --out DIR --hybrid train.jsonl --reference train.jsonl
    envace probe --model PATH dev.jsonl --out DIR --choose train.jsonl --hybrid train.jsonl
    envace probe --likelihood --model PATH dev.jsonl --out DIR [--reference train.jsonl]
    envace probe --likelihood --endpoint URL --model NAME --tokenizer PATH dev.jsonl --out DIR

`run_probe_cli` is what `envace probe` calls (`envace-audit probe` only says it moved): this
module holds the parser and the argument checks; the runs live with the probe, one place per
layer: with `--endpoint` a served model through `envace.evaluation.endpoint_probe` (no torch),
with `--ranker` the learned ranker through `audit.probe` (no torch), else a local model through
`envace.evaluation.model_probe` (batched rounds, greedy).

`--memory` shows the world model, before each tool turn, a note of the k most similar training
calls and their real responses; `--hybrid` answers with the lookup's exact answer where there is
one and asks the model elsewhere; `--choose` lets the model rank its own answer against the
tool's most common training response and the k most similar calls' responses by its own
log-probability (`audit.worlds.memory`, `audit.worlds.choice`; all from a train-split file only,
never from the asking task's own scenario). The summary's `audited_model` names the composite
(`PATH+memory(k=3)`, `PATH+choice(k=3)`, `hybrid(lookup,PATH)`) and its `world_model` block records
the files, k and what the choice chose.

"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from audit.cli import add_cluster_by
from audit.probe import HISTORY_CHOICES
from audit.probe_cli import run_ranker_probe
from audit.scoring.scorers import DEFAULT_SCORERS, list_scorers
from audit.worlds.memory import DEFAULT_K
from audit.worlds.ranker import RANKER_K
from envace.cli.argtypes import count, number
from envace.core.envs.limits import limit_arg
from envace.core.errors import EXIT_USAGE
from envace.core.outfile import input_problem
from envace.evaluation.endpoint_likelihood import run_endpoint_likelihood_cli
from envace.evaluation.endpoint_probe import run_endpoint_probe
from envace.evaluation.likelihood import run_likelihood_cli
from envace.evaluation.model_probe import run_model_probe
from envace.model.windows import MIN_PROMPT

#: options of a generating or served model, refused with --ranker when changed
SERVED_DEFAULTS = {"max_new_tokens": 256, "api": "completions", "concurrency": 4,
                   "timeout": 60.0, "retries": 3}


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    """`envace probe`: the teacher-forced audit of a local or a served model."""
    p = sub.add_parser(name, help="teacher-forced one-step audit of a model (local or served)",
                       description=__doc__.split("\n")[0])
    p.add_argument("inputs", nargs="+", help="real trajectories (envace data export-real)")
    p.add_argument("--model",
                   help="a model folder or smollm2; with --endpoint, the served model's name "
                        "(required unless --ranker)")
    p.add_argument("--endpoint", help="an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--out", required=True)
    p.add_argument("--max-new-tokens", type=count(1), default=SERVED_DEFAULTS["max_new_tokens"])
    p.add_argument("--limit", type=count(0), default=0, help="at most this many trajectories")
    p.add_argument("--reference", help="training trajectories: skill against reference models")
    p.add_argument("--scorers", nargs="+", default=list(DEFAULT_SCORERS))
    p.add_argument("--verdict", default="exact", help="scorer deciding divergence")
    p.add_argument("--threshold", type=number(0, 1), default=1.0,
                   help="diverged = verdict score < threshold (default 1.0)")
    p.add_argument("--history", choices=sorted(HISTORY_CHOICES), default="real",
                   help="the history each call is rehearsed from: real (teacher-forced, the "
                        "real responses of earlier calls), own (self-conditioned: the model's "
                        "own earlier answers), both (each call twice, paired: the summary's "
                        "history block splits divergence into difficulty and compounding)")
    add_cluster_by(p)
    p.add_argument("--quiet", action="store_true", help="no progress")
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="a local model encodes every step's prompt from scratch (the per-step "
                        "path; by default each trajectory's KV cache is kept across its calls: "
                        "same greedy answers up to float summation order, docs/profiling.md)")
    p.add_argument("--call-timeout", type=limit_arg, default=30.0, metavar="S",
                   help="wall-clock limit of every real environment call (its process is "
                        "killed past it; docs/audit.md, limits; default %(default)g; 0: none)")
    p.add_argument("--call-memory-mb", type=limit_arg, default=4096, metavar="MB",
                   help="memory a real call may add to the environment's process (0: none)")
    g = p.add_argument_group("grounded world models (a memory of real responses)")
    g.add_argument("--memory", metavar="TRAIN.jsonl",
                   help="show the model, before each tool turn, the --memory-k most similar "
                        "calls of this train-split real trajectory file (envace data export-real "
                        "--split train) and what the real environment returned; never calls of "
                        "the task's own scenario; a file with any non-train task is refused")
    g.add_argument("--memory-k", type=count(1), default=None, metavar="K",
                   help=f"entries per note with --memory (default {DEFAULT_K})")
    g.add_argument("--hybrid", metavar="TRAIN.jsonl",
                   help="the hybrid world model: the lookup's exact answer where this "
                        "train-split file made the identical call (the audit's lookup "
                        "reference), the model (with --memory: shown the memory) elsewhere")
    g.add_argument("--choose", metavar="TRAIN.jsonl",
                   help="the choosing world model: for each call the model ranks, by its own "
                        "log-probability after the prompt it answered, its greedy answer, the "
                        "tool's most common response in this train-split file and the "
                        "responses of the --memory-k most similar calls there, and answers with "
                        "the most probable (audit.worlds.choice; a local model only)")
    g.add_argument("--choose-among", choices=["all", "memory"], default="all",
                   help="with --choose: all (default) ranks the model's own answer too; memory "
                        "ranks the real responses only (the model writes an answer only where "
                        "none of its tool can be scored)")
    g.add_argument("--choose-edits", action="store_true",
                   help="with --choose: the similar calls' responses with this call's differing "
                        "argument values copied in are candidates too (what the audit's edit "
                        "reference answers with the most similar one)")
    g.add_argument("--ranker", metavar="TRAIN.jsonl",
                   help="instead of a model: the learned ranker (audit.worlds.ranker), fitted "
                        "on this train-split file, picks among its real responses and their "
                        "copy-edits by features of the call and the conversation so far "
                        f"(k={RANKER_K})")
    lk = p.add_argument_group("likelihood audit (docs/audit.md, \"How probable is reality\")")
    lk.add_argument("--likelihood", action="store_true",
                    help="instead of generating: score every real tool response under the model "
                         "given the real history (one forward per trajectory that fits the "
                         "context, one per call where it does not); step rows gain "
                         "`likelihood`, the summary a bits-per-byte block; with --reference "
                         "TRAIN.jsonl also the primed-compressor yardstick")
    lk.add_argument("--confidence", action="store_true",
                    help="a generating probe: score each answer after its prompt too (a served "
                         "model: on the server, prompt_logprobs), so each step row gets "
                         "`confidence` (its mean token log-probability) and the summary a "
                         "`confidence` block (AUROC, reliability, risk-coverage)")
    lk.add_argument("--context", type=count(1), default=None, metavar="N",
                    help="the context in tokens every prompt is cut to, as SFT windows are "
                         "(default: the model's fine-tuning seq_len, else 2048); with --endpoint "
                         "the cut prompt goes to the server as token ids")
    lk.add_argument("--tokenizer", metavar="PATH",
                    help="with --endpoint: a local folder (or smollm2) with the served model's "
                         "tokenizer; the prompts are then cut to --context as the in-process "
                         "probe cuts them and sent as token ids (needed by --likelihood and "
                         "--confidence; default there: --model, when it is a local folder)")
    e = p.add_argument_group("served model (--endpoint)")
    e.add_argument("--api", default=SERVED_DEFAULTS["api"], choices=["completions", "chat"],
                   help="completions: envace's ChatML prompt (default); chat: chat/completions")
    e.add_argument("--concurrency", type=int, default=SERVED_DEFAULTS["concurrency"],
                   help="requests in flight at most")
    e.add_argument("--timeout", type=float, default=SERVED_DEFAULTS["timeout"],
                   help="seconds per request attempt")
    e.add_argument("--retries", type=int, default=SERVED_DEFAULTS["retries"],
                   help="retries of a timeout, 5xx or malformed answer (backoff 0.5 s, x2)")
    p.set_defaults(func=run_probe_cli, prog=f"envace {name}")


def _check_usage(args: argparse.Namespace) -> str | None:
    """Why the arguments cannot work (one line), or None."""
    for p in args.inputs:
        why = input_problem(p)
        if why:
            return why
    if (getattr(args, "limit", 0) or 0) < 0:
        return "--limit must be >= 0 (0: every trajectory)"
    reference = getattr(args, "reference", None)
    if reference and input_problem(reference):
        return f"--reference: {input_problem(reference)}"
    if getattr(args, "no_prefix_cache", False) and (getattr(args, "endpoint", None)
                                                    or getattr(args, "ranker", None)):
        return "--no-prefix-cache is about a local model's cache: not with --endpoint or --ranker"
    if getattr(args, "ranker", None):
        used = [f"--{f.replace('_', '-')}" for f in ("model", "endpoint", "memory", "hybrid",
                                                      "choose", "memory_k")
                if getattr(args, f, None)]
        if used:
            return f"--ranker is a world model of its own: not with {', '.join(used)}"
        served = [f"--{k.replace('_', '-')}" for k, default in SERVED_DEFAULTS.items()
                  if getattr(args, k, default) != default]
        if served:
            return f"--ranker generates nothing and asks no server: not with {', '.join(served)}"
    elif not getattr(args, "model", None):
        return "give --model (a model folder, smollm2 or a served name) or --ranker TRAIN.jsonl"
    for flag in ("memory", "hybrid", "choose", "ranker"):
        given = getattr(args, flag, None)
        if given and not Path(given).is_file():
            return f"no such --{flag} file: {given}"
    k = getattr(args, "memory_k", None)
    if k is not None and (k < 1 or not (getattr(args, "memory", None)
                                        or getattr(args, "choose", None))):
        return "--memory-k needs --memory or --choose and must be >= 1"
    if getattr(args, "choose_among", "all") != "all" and not getattr(args, "choose", None):
        return "--choose-among needs --choose"
    if getattr(args, "choose_edits", False) and not getattr(args, "choose", None):
        return "--choose-edits needs --choose"
    if getattr(args, "likelihood", False):
        used = [f"--{f.replace('_', '-')}" for f in ("ranker", "memory", "hybrid", "choose")
                if getattr(args, f, None)]
        if used or getattr(args, "history", "real") != "real":
            used += ["--history"] if getattr(args, "history", "real") != "real" else []
            return (f"--likelihood scores the real responses given the real history: not with "
                    f"{', '.join(used)}")
        if getattr(args, "endpoint", None) and getattr(args, "api", "completions") != "completions":
            return "--likelihood --endpoint uses /v1/completions: not with --api chat"
        if getattr(args, "confidence", False):
            return "--confidence goes with a generating probe, not --likelihood"
    context = getattr(args, "context", None)
    room = getattr(args, "max_new_tokens", 0) + MIN_PROMPT
    if context is not None and not getattr(args, "likelihood", False) and context < room:
        return (f"--context {context} leaves no room for a prompt: a generating probe needs at "
                f"least --max-new-tokens + {MIN_PROMPT} ({room})")
    cutting = context or getattr(args, "tokenizer", None)
    if getattr(args, "tokenizer", None) and not getattr(args, "endpoint", None):
        return "--tokenizer is a served model's tokenizer: it goes with --endpoint"
    if cutting and getattr(args, "ranker", None):
        return "--context and --tokenizer cut a model's prompts: not with --ranker"
    if cutting and getattr(args, "endpoint", None) \
            and getattr(args, "api", "completions") != "completions":
        return ("--context and --tokenizer send the cut prompt as token ids on /v1/completions: "
                "not with --api chat")
    if getattr(args, "confidence", False) and getattr(args, "ranker", None):
        return "--confidence needs a model (it scores the answers with it), not the ranker"
    if getattr(args, "confidence", False) and getattr(args, "endpoint", None) \
            and getattr(args, "api", "completions") != "completions":
        return "--confidence --endpoint scores on /v1/completions: not with --api chat"
    known = set(list_scorers())
    bad = [s for s in [*args.scorers, args.verdict] if s not in known]
    if bad:
        return f"unknown scorer(s) {', '.join(bad)}; known: {', '.join(sorted(known))}"
    if getattr(args, "endpoint", None):
        if getattr(args, "choose", None):
            return ("--choose needs a local model (it scores candidates by the model's "
                    "log-probability); not with --endpoint")
        if args.concurrency < 1 or args.retries < 0 or args.timeout <= 0:
            return "--concurrency must be >= 1, --retries >= 0, --timeout > 0"
    elif args.model == "tiny":
        return ("the tiny preset is untrained; give a model folder (e.g. an `envace sft` "
                "output) or smollm2")
    return None


def run_probe_cli(args: argparse.Namespace) -> int:
    """`envace probe` / `envace-audit probe`: check the arguments, run the probe of a served
    model, the ranker or a local model; the exit code."""
    prog = getattr(args, "prog", "envace-audit probe")
    why = _check_usage(args)
    if why:
        print(f"{prog}: {why}", file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "likelihood", False):
        if getattr(args, "endpoint", None):
            return run_endpoint_likelihood_cli(args)
        return run_likelihood_cli(args)
    if getattr(args, "endpoint", None):
        return run_endpoint_probe(args)
    if getattr(args, "ranker", None):
        return run_ranker_probe(args)
    return run_model_probe(args)
