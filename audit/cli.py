"""The `envace-audit` command.

    envace-audit replay INPUT.jsonl... --out DIR [--scorers exact json_f1 ...] [--workers N]
                        [--verdict exact --threshold 1.0] [--reference train.jsonl]
    envace-audit rescore DIR --scorers exact json_f1 [--verdict json_f1 --threshold 0.9] [--out D]
    envace-audit compare DIR_A DIR_B [--out DIR] [--cluster-by trajectory|task|scenario|FIELD]
    envace-audit baseline INPUT.jsonl --reference train.jsonl --model lookup --out DIR
    envace-audit replay mcp.jsonl --mcp-config servers.yaml --out DIR   (mcp:<profile> envs)
    envace-audit replay INPUT.jsonl --shard I/N --out SHARD_I   (one of N shards, 0 <= I < N)
    envace-audit merge SHARD_0 ... SHARD_N-1 --out DIR          (the audit a single run gives)

Exit codes: 0 audit written and every record audited; 3 audit written but some records were
skipped (each listed with file, line and reason in summary.json and on stderr); 2 bad usage,
unreadable input or a refused output (nothing written); 130 interrupted (Ctrl-C), 143 SIGTERM,
129 SIGHUP (one line: nothing written, or, when the stop came after the output was moved into
place, that it is complete); 1 an internal error (a bug). Outputs go to a fresh directory
renamed into place when complete, never over an input or another tool's files
(``audit.store.output``). The teacher-forced probe of a model is `envace probe` (it needs the
model runtime); `envace-audit probe` says so.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from audit.shard import parse_shard
from audit.stats.clusters import check_unit
from envace.core.envs.limits import DEFAULT_CALL_TIMEOUT_S, DEFAULT_MEMORY_MB, limit_arg
from envace.core.envs.mcp.options import McpOptionError, take_mcp_options
from envace.core.errors import (
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_SKIPPED,
    EXIT_USAGE,
    UsageError,
)
from envace.core.interrupts import Stopped, run_command, stopping
from envace.core.layout import AUDIT
from envace.core.outfile import input_problem
from envace.core.text import terminal_safe

#: `audit.worlds.reference.REFERENCE_NAMES`, named here so that `--help` imports no numpy (tested
#: equal)
BASELINES = ("majority", "lookup", "edit", "echo", "empty")

SHOWN = 10  # skipped records and warnings printed on stderr (all are in summary.json)

#: The most worker processes an audit starts (each holds its environments: ~100-300 MB).
MAX_WORKERS = 256


def _add_scoring(p: argparse.ArgumentParser) -> None:
    # lazy: loads rapidfuzz: kept out of --help
    from audit.scoring.scorers import DEFAULT_SCORERS

    p.add_argument("--scorers", nargs="+", default=list(DEFAULT_SCORERS),
                   help="scorer names (default: %(default)s)")
    p.add_argument("--verdict", default="exact", help="scorer deciding divergence")
    p.add_argument("--threshold", type=float, default=1.0,
                   help="diverged = verdict score < threshold (default 1.0)")


CLUSTER_HELP = ("what intervals, paired tests and skill intervals resample: trajectory, task, "
                "scenario (BFCL's four variants of one scenario together) or a step-row FIELD; "
                "default: the unit the environment declares (BFCL: scenario; AgentDojo, "
                "others: task)")


def cluster_unit(value: str) -> str:
    """argparse type of ``--cluster-by`` (a bad value is a usage error, exit 2)."""
    err = check_unit(value)
    if err:
        raise argparse.ArgumentTypeError(err)
    return value


def _alpha(text: str) -> float:
    """argparse type of ``--alpha``: a level strictly between 0 and 1 (else exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r}: give a level strictly between 0 and 1")
    return value


def add_cluster_by(p: argparse.ArgumentParser) -> None:
    """``--cluster-by`` (audit replay/baseline/rescore/compare, envace probe)."""
    p.add_argument("--cluster-by", type=cluster_unit, default=None, metavar="UNIT",
                   help=CLUSTER_HELP)
def _add_limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--call-timeout", type=limit_arg, default=DEFAULT_CALL_TIMEOUT_S, metavar="S",
                   help="wall-clock limit of every real environment call, C code included: the "
                        "environment runs in a child process killed past it, the call answers "
                        "an error marked timeout (default %(default)g; 0: no limit)")
    p.add_argument("--call-memory-mb", type=limit_arg, default=DEFAULT_MEMORY_MB, metavar="MB",
                   help="memory a call may add to the environment's process (RLIMIT_AS; "
                        "default %(default)d; 0: no limit)")
    p.add_argument("--no-state-change", dest="state_change", action="store_false",
                   help="do not record how each call changed the real state (one state() per "
                        "call: costs most where the state is big, tau2's 3 MB databases)")


def _limits(args: argparse.Namespace) -> dict[str, object]:
    if not hasattr(args, "call_timeout"):
        return {}
    return {"call_timeout_s": args.call_timeout or None,
            "call_memory_mb": int(args.call_memory_mb) or None,
            "state_change": getattr(args, "state_change", True)}


def _options(args: argparse.Namespace, **extra: object):
    # lazy: loads rapidfuzz: kept out of --help
    from audit.scoring.settings import AuditOptions

    return AuditOptions(scorers=list(args.scorers), verdict_scorer=args.verdict,
                        verdict_threshold=args.threshold, progress=not args.quiet,
                        cluster_by=getattr(args, "cluster_by", None), **extra)


def _validate_scorers(args: argparse.Namespace) -> str | None:
    # lazy: loads rapidfuzz: kept out of --help
    from audit.scoring.scorers import list_scorers

    known = set(list_scorers())
    bad = [s for s in [*args.scorers, args.verdict] if s not in known]
    if bad:
        return f"unknown scorer(s) {', '.join(bad)}; known: {', '.join(sorted(known))}"
    if not 0 <= args.threshold <= 1:
        return "--threshold must lie in [0, 1]"
    return None


def _list(kind: str, items: list[dict], fmt: str) -> None:
    # lazy: loads pydantic: kept out of --help
    from audit.store.models import place

    for item in items[:SHOWN]:
        print(terminal_safe(f"  {kind} " + fmt.format(**item, where=place(item))),
              file=sys.stderr)
    if len(items) > SHOWN:
        print(f"  ... and {len(items) - SHOWN} more {kind} (see {AUDIT.summary})", file=sys.stderr)


def _finish(summary: dict, out: str) -> int:
    c = summary["counts"]
    rate = summary.get("divergence_rate")
    rate_s = "n/a" if rate is None else f"{rate:.1%}"
    what = ("real steps (determinism check, must be 0)" if summary.get("determinism_check")
            else f"rehearsed steps ({c.get('scored_steps', '?')})")
    print(f"audited {c['trajectories']} trajectories, {c['steps']} tool calls "
          f"({c['malformed_calls']} malformed, {c['unanswered_steps']} unanswered); "
          f"divergence of {what} {rate_s}; skipped {c['skipped']} records -> "
          f"{Path(out) / AUDIT.report}")
    if summary.get("determinism_warning"):
        print(f"  warning: {terminal_safe(summary['determinism_warning'])}", file=sys.stderr)
    _list("skipped", summary["skipped_records"], "{where}: {reason}")
    _list("warning", summary.get("warnings") or [], "{where}: {message}")
    ref_skipped = summary.get("reference_skipped_records") or []
    _list("skipped in --reference", ref_skipped, "{where}: {reason}")
    return EXIT_SKIPPED if c["skipped"] or ref_skipped else EXIT_OK


def _unreadable(paths: list[str]) -> str | None:
    for p in paths:
        why = input_problem(p)
        if why:
            return why
    return None


def cmd_replay(args: argparse.Namespace) -> int:
    # lazy: loads numpy, pydantic, rapidfuzz: kept out of --help
    from audit.pipeline import run_audit

    err = _unreadable(args.inputs)
    if err:
        print(f"envace-audit: {err}", file=sys.stderr)
        return EXIT_USAGE
    if args.reference and _unreadable([args.reference]):
        print(f"envace-audit: reference: {_unreadable([args.reference])}", file=sys.stderr)
        return EXIT_USAGE
    if args.call_timeout < 0 or args.call_memory_mb < 0:
        print("envace-audit: --call-timeout and --call-memory-mb must be >= 0 (0: no limit)",
              file=sys.stderr)
        return EXIT_USAGE
    opts = _options(args, workers=args.workers, reference=args.reference,
                    override=getattr(args, "model", None), shard=args.shard, **_limits(args))
    return _finish(run_audit(args.inputs, args.out, opts), args.out)


def shard_arg(text: str) -> tuple[int, int]:
    """argparse type of ``--shard I/N`` (a bad value is a usage error, exit 2)."""
    try:
        return parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_shard(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shard", type=shard_arg, default=None, metavar="I/N",
                   help="audit only the I-th of N deterministic shards of the input (by "
                        "trajectory id, 0 <= I < N); `envace-audit merge` joins them")


def cmd_merge(args: argparse.Namespace) -> int:
    # lazy: loads numpy and pydantic (the summary): kept out of --help
    from audit.merge import merge_shards

    return _finish(merge_shards(args.shards, args.out), args.out)


def cmd_rescore(args: argparse.Namespace) -> int:
    # lazy: loads numpy, pydantic, rapidfuzz: kept out of --help
    from audit.rescore import rescore

    src = Path(args.dir)
    why = input_problem(src / AUDIT.steps)
    if why:
        print(f"envace-audit: {src} is not an audit directory ({why})", file=sys.stderr)
        return EXIT_USAGE
    out = args.dir if args.out is None else args.out
    return _finish(rescore(src, Path(out), _options(args)), out)


def cmd_compare(args: argparse.Namespace) -> int:
    # lazy: loads numpy, pydantic: kept out of --help
    from audit.compare import compare_audits, render_compare

    for d in (args.a, args.b):
        why = input_problem(Path(d) / AUDIT.steps)
        if why:
            print(f"envace-audit: {d} is not an audit directory ({why})", file=sys.stderr)
            return EXIT_USAGE
    if args.out is not None:
        # lazy: loads pydantic: kept out of --help
        from audit.store.output import OutputDir

        with OutputDir(args.out, [args.a, args.b], kind="compare") as tmp:
            result = compare_audits(args.a, args.b, alpha=args.alpha,
                                    cluster_by=args.cluster_by)
            text = render_compare(result)
            # lazy: loads pydantic: kept out of --help
            from audit.store.output import write_json_atomic

            write_json_atomic(tmp / AUDIT.compare_json, result)
            (tmp / AUDIT.compare_md).write_text(text, encoding="utf-8")
    else:
        result = compare_audits(args.a, args.b, alpha=args.alpha, cluster_by=args.cluster_by)
        text = render_compare(result)
    print("\n".join(terminal_safe(line) for line in text.split("\n")))
    _list("skipped", result["skipped_records"], "{where}: {reason}")
    return EXIT_SKIPPED if result["skipped_records"] else EXIT_OK


PROBE_MOVED = ("envace-audit probe has moved: run `envace probe` with the same arguments "
               "(the model side lives in the envace runtime; the audit never imports torch)")


def cmd_probe(args: argparse.Namespace) -> int:
    print(PROBE_MOVED, file=sys.stderr)
    return EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="envace-audit", description=__doc__.split("\n")[0])
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("replay", help="replay trajectories against the real environment")
    r.add_argument("inputs", nargs="+")
    r.add_argument("--out", required=True)
    r.add_argument("--workers", type=int, default=1,
                   help=f"worker processes replaying trajectories (1..{MAX_WORKERS}; default 1)")
    r.add_argument("--reference", help="training trajectories: audit reference world models too")
    _add_scoring(r)
    add_cluster_by(r)
    _add_limits(r)
    _add_shard(r)
    r.set_defaults(func=cmd_replay)
    b = sub.add_parser("baseline", help="audit a reference world model alone")
    b.add_argument("inputs", nargs="+")
    b.add_argument("--reference", required=True)
    b.add_argument("--model", default="lookup", choices=BASELINES,
                   help="which reference world model (audit.worlds.reference: lookup, edit, ...)")
    b.add_argument("--out", required=True)
    b.add_argument("--workers", type=int, default=1,
                   help=f"worker processes (1..{MAX_WORKERS}; default 1)")
    _add_scoring(b)
    add_cluster_by(b)
    _add_limits(b)
    _add_shard(b)
    b.set_defaults(func=cmd_replay)
    s = sub.add_parser("rescore", help="new scorers over a stored audit, no replay")
    s.add_argument("dir")
    s.add_argument("--out", help="write here instead of in place")
    _add_scoring(s)
    add_cluster_by(s)
    s.set_defaults(func=cmd_rescore)
    c = sub.add_parser("compare", help="two audits side by side")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--alpha", type=_alpha, default=0.05,
                   help="significance level, strictly between 0 and 1 (default 0.05)")
    c.add_argument("--out")
    add_cluster_by(c)
    c.set_defaults(func=cmd_compare)
    m = sub.add_parser("merge", help="join the shards of one audit (replay --shard I/N)")
    m.add_argument("shards", nargs="+", metavar="SHARD_DIR")
    m.add_argument("--out", required=True)
    m.set_defaults(func=cmd_merge)
    pr = sub.add_parser("probe", help="moved to `envace probe`", description=PROBE_MOVED)
    pr.add_argument("rest", nargs=argparse.REMAINDER, help="ignored")
    pr.set_defaults(func=cmd_probe)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit code. Ctrl-C, SIGTERM and SIGHUP stop it with one line
    and ``128 + signal`` (130, 143, 129), no traceback (``envace.core.interrupts``)."""
    return run_command("envace-audit", lambda: _main(argv), final=argv is None)


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)

    try:  # --mcp-config FILE: the MCP server profiles that mcp:<profile> trajectories name
        argv = take_mcp_options(argv)
    except McpOptionError as exc:
        print(f"envace-audit: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    if [a for a in argv if a != "--quiet"][:1] == ["probe"] and not {"-h", "--help"} & set(argv):
        return cmd_probe(argparse.Namespace())  # moved: one line, whatever its arguments
    args = build_parser().parse_args(argv)
    for opt in ("quiet",):
        setattr(args, opt, getattr(args, opt, False))
    if hasattr(args, "scorers"):
        err = _validate_scorers(args)
        if err:
            print(f"envace-audit: {err}", file=sys.stderr)
            return EXIT_USAGE
    if not 1 <= getattr(args, "workers", 1) <= MAX_WORKERS:
        print(f"envace-audit: --workers must be between 1 and {MAX_WORKERS} (worker processes, "
              "each with its environments)", file=sys.stderr)
        return EXIT_USAGE
    try:
        return args.func(args)
    except BrokenPipeError:
        return EXIT_OK
    except UsageError as exc:
        print(f"envace-audit: {terminal_safe(exc)}; nothing written", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # the system refused a read or a write (disk full, permissions)
        where = f" {exc.filename}" if exc.filename else ""
        print(f"envace-audit: cannot read or write{where}: {exc.strerror or exc}; nothing "
              "written", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        if (signum := stopping()) is not None:  # e.g. a C extension interrupted while loading
            raise Stopped(signum) from None
        if os.environ.get("ENVACE_DEBUG"):
            raise
        print(f"envace-audit: internal error: {type(exc).__name__}: {terminal_safe(exc)} "
              "(set ENVACE_DEBUG=1 for a traceback)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
