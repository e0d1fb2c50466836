"""The steps of `envace probe` that every kind of world model shares: the audit options of its
flags, the grounding files (`--memory`, `--choose`, `--hybrid`), the closing line and exit code,
and the learned ranker's run (no torch).

`args` below is `envace probe`'s namespace (`envace.cli.probe`); the local and the served model's
runs (`envace.evaluation.model_probe`, `envace.evaluation.endpoint_probe`) share these. The probe
itself is `audit.probe`.
"""

from __future__ import annotations

import sys
from typing import Any

from audit.probe import HISTORY_CHOICES, run_probe
from audit.scoring.settings import AuditOptions
from audit.stats.history import history_line
from audit.worlds.memory import (
    DEFAULT_K,
    NOTE_CHARS,
    MemoryOptions,
    ResponseMemory,
    train_tasks_in,
)
from audit.worlds.ranker import fit_ranker
from envace.core.errors import EXIT_OK, EXIT_SKIPPED, EXIT_USAGE, UsageError


def probe_options(args: Any, progress: bool) -> AuditOptions:
    """The `AuditOptions` of the probe's scoring, reference, cluster and limit flags."""
    return AuditOptions(scorers=list(args.scorers), verdict_scorer=args.verdict,
                        verdict_threshold=args.threshold, progress=progress,
                        reference=getattr(args, "reference", None),
                        cluster_by=getattr(args, "cluster_by", None),
                        call_timeout_s=getattr(args, "call_timeout", 30.0) or None,
                        call_memory_mb=int(getattr(args, "call_memory_mb", 4096)) or None)


def load_grounding(args: Any, max_chars: int | None = None) -> MemoryOptions:
    """The `MemoryOptions` of `--memory`, `--memory-k`, `--choose` (`--choose-among`,
    `--choose-edits`) and `--hybrid` (inactive when no file is given); `UsageError` when a file
    is refused."""
    memory, hybrid = getattr(args, "memory", None), getattr(args, "hybrid", None)
    choose = getattr(args, "choose", None)
    k = getattr(args, "memory_k", None) or DEFAULT_K
    return MemoryOptions(memory=ResponseMemory.from_file(memory) if memory else None, k=k,
                         hybrid=ResponseMemory.from_file(hybrid) if hybrid else None,
                         choose=ResponseMemory.from_file(choose) if choose else None,
                         choose_own=getattr(args, "choose_among", "all") != "memory",
                         choose_edits=bool(getattr(args, "choose_edits", False)),
                         max_chars=NOTE_CHARS if max_chars is None else max_chars)


def print_history(summary: dict[str, Any]) -> None:
    """The real-vs-own line (`audit.stats.history.history_line`), when the probe ran both."""
    line = history_line(summary)
    if line is not None:
        print(line)


def finish(args: Any, summary: dict[str, Any], what: str = "") -> int:
    """The closing line of a local probe (unless ``--quiet``) and its exit code."""
    c = summary["counts"]
    if not args.quiet:
        rate = summary.get("divergence_rate")
        shown = f"{rate:.1%}" if isinstance(rate, float) else "n/a"
        print(f"probed {c['steps']} calls of {c['trajectories']} trajectories "
              f"(skipped {c['skipped']}){what}: divergence {shown}; wrote {args.out}")
        print_history(summary)
    return EXIT_SKIPPED if c["skipped"] else EXIT_OK


def run_ranker_probe(args: Any) -> int:
    """`envace probe --ranker TRAIN.jsonl`: the audit of the learned ranker (no torch); the
    exit code."""
    prog = getattr(args, "prog", "envace probe")
    try:
        memory = ResponseMemory.from_file(args.ranker)
        ranker = fit_ranker(memory, args.ranker)
    except (UsageError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    fitted = train_tasks_in(list(args.inputs))
    if fitted:
        print(f"{prog}: warning: {fitted} input trajectories are train-split tasks the ranker "
              "was fitted on: their figures are in-sample (probe dev or test tasks)",
              file=sys.stderr)
    opts = probe_options(args, progress=not args.quiet)
    tally: dict[str, int] = {}
    try:
        summary = run_probe(list(args.inputs), args.out, None, opts, args.limit,
                            label=f"ranker(k={ranker.k})", answer_batch=ranker.batch(tally),
                            histories=HISTORY_CHOICES[args.history], task_ids=True,
                            extra=lambda: {"world_model": {"ranker": {
                                **ranker.block(tally), "train_split_inputs": fitted}}})
    except UsageError as exc:  # a refused --out: one line and 2, as documented
        print(f"{prog}: {exc}; nothing written", file=sys.stderr)
        return EXIT_USAGE
    return finish(args, summary, " with the ranker")
