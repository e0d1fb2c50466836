"""The `envace` command.

    envace data export-real --split dev --out dev.jsonl     real trajectories (ground truth run)
    envace data export-real --env agentdojo --split all --out agentdojo.jsonl
    envace data export-real --env tau2 --split dev [--domain airline] --out tau2_dev.jsonl
    envace envs                                            environments installed: tasks, tools
    envace data splits                                     split sizes and overlap note
    envace data record --env mcp:NAME --mcp-config servers.yaml --tasks tasks.jsonl --out F
    envace sft --preset tiny                               cold start (trl SFTTrainer)
    envace rollout --model PATH --split dev --mode rehearse --out FILE.jsonl
    envace probe --endpoint URL --model NAME dev.jsonl --out DIR   audit a served world model
    envace board --models models.yaml --envs bfcl agentdojo tau2 --out boards/dev   the board
    envace train [--config configs/tiny.yaml] [key=value ...] [--resume runs/NAME]

`--mcp-config FILE` and `--mcp-tasks FILE` (MCP server profiles and their task file, docs/mcp.md)
are taken by every subcommand, anywhere on the command line.

Heavy modules (torch, transformers) are imported only by the subcommands that need them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from envace.core.envs.base import UnknownEnvironment
from envace.core.envs.bfcl.tasks import (
    CATEGORIES,
    SPLITS,
    UnknownTask,
    get_task,
    load_tasks,
    split_tasks,
)
from envace.core.envs.family import family
from envace.core.envs.guard import guarded_env
from envace.core.envs.limits import CallLimits, CallTimeout, EnvProcessDied, limit_arg
from envace.core.envs.mcp.options import McpOptionError, take_mcp_options
from envace.core.envs.mcp.taskfile import TaskFileError
from envace.core.envs.task_common import DATA_DIR
from envace.core.errors import UsageError
from envace.core.interrupts import run_command, stopping
from envace.core.outfile import atomic_output
from envace.core.text import terminal_safe


def _cmd_export_real(args: argparse.Namespace) -> int:
    if args.domain is not None and args.env != "tau2":
        print("envace: --domain is for --env tau2 (its domains: airline, retail, telecom, "
              "telecom_full)", file=sys.stderr)
        return 2
    if args.env != "bfcl":
        return _export_other(args)
    # lazy: loads pydantic: kept out of --help
    from envace.core.export import export_real

    if args.tasks:
        try:
            tasks = [get_task(t) for t in args.tasks]
        except UnknownTask as exc:
            print(f"envace: {terminal_safe(exc)}", file=sys.stderr)
            return 2
    elif args.split == "all":
        tasks = [t for t in load_tasks().values() if t.category in args.categories]
    else:
        tasks = split_tasks(args.split, tuple(args.categories))
    skipped: list[tuple[str, str]] = []
    return _write(export_real(tasks, turn_end=not args.no_turn_end, limits=_limits(args),
                              skipped=skipped), args.out, skipped)


def _limits(args: argparse.Namespace) -> Any:
    return CallLimits(args.call_timeout or None, int(args.call_memory_mb) or None)


def _export_other(args: argparse.Namespace) -> int:
    # lazy: loads pydantic: kept out of --help
    from envace.core.export import export_env

    try:
        if args.tasks:
            ids = list(args.tasks)
        elif args.env.startswith("mcp:"):  # the tasks of --mcp-tasks FILE (their split field)

            ids = [t.id for t in family(args.env).split_tasks(args.split, "task")]
        elif args.env == "agentdojo":
            # lazy: its load_tasks would shadow BFCL's, imported above
            from envace.core.envs.agentdojo.tasks import DEFAULT_VERSION, load_tasks, split_ids

            version = args.benchmark_version or DEFAULT_VERSION
            known = load_tasks(version)
            ids = list(known) if args.split == "all" else [
                i for i in split_ids(args.split) if i in known]
        elif args.env == "tau2":
            # lazy: loads pydantic: kept out of --help
            from envace.core.envs.tau2.tasks import split_ids as tau2_ids

            ids = tau2_ids(args.split, args.domain)
        else:
            # a plugin's import failure: PluginLoadError, exit 2; its listing runs under the call
            # limits like every call (a task_ids() that stalls is cut: exit 2)
            env = guarded_env(args.env, _limits(args))
            if args.split != "all" or not hasattr(env, "task_ids"):
                print(f"envace: {args.env} has no committed splits: use --split all "
                      "(needs task_ids) or --tasks", file=sys.stderr)
                return 2
            ids = list(env.task_ids())
        skipped: list[tuple[str, str]] = []
        trajs = export_env(args.env, ids, turn_end=not args.no_turn_end,
                           version=args.benchmark_version, limits=_limits(args),
                           skipped=skipped)
        return _write(trajs, args.out, skipped)
    except (UnknownEnvironment, KeyError, ValueError, RuntimeError, CallTimeout,
            EnvProcessDied) as exc:
        print(f"envace: {terminal_safe(str(exc))}", file=sys.stderr)
        return 2


def _write(trajs: Any, out: str, skipped: list[tuple[str, str]] | None = None) -> int:
    """Write the trajectories; a task that could not be recorded is named on stderr (exit 3)."""
    # lazy: loads pydantic: kept out of --help
    from envace.core.schema import RecordTooLarge, TrajectoryWriter

    n = 0
    skipped = skipped if skipped is not None else []
    try:  # whole or not at all: a full disk or a refused --out leaves nothing (exit 2)
        with atomic_output(out) as tmp, TrajectoryWriter(tmp, mode="w") as w:
            for traj in trajs:
                try:
                    w.write(traj)
                except RecordTooLarge as exc:  # one record past the line limit costs one
                    skipped.append((traj.task_id, str(exc)))
                    continue
                n += 1
    except (UsageError, OSError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        print(f"envace data export-real: {terminal_safe(str(why))}; nothing written",
              file=sys.stderr)
        return 2
    print(f"wrote {n} real trajectories to {terminal_safe(out)}"
          + (f"; skipped {len(skipped)} task(s)" if skipped else ""))
    for tid, reason in skipped[:20]:
        print(f"  skipped {terminal_safe(tid)}: {terminal_safe(reason)}", file=sys.stderr)
    return 3 if skipped else 0


def _cmd_record(args: argparse.Namespace) -> int:
    # lazy: loads yaml: kept out of --help
    from envace.core.envs.mcp.profile import ProfileError
    from envace.core.envs.mcp.record import run

    try:
        return run(args.env, args.tasks, args.out, turn_end=not args.no_turn_end)
    except (ProfileError, TaskFileError, OSError) as exc:
        print(f"envace data record: {terminal_safe(exc)}", file=sys.stderr)
        return 2


def _cmd_envs(args: argparse.Namespace) -> int:
    # lazy: read at call time: tests patch it where it is defined
    from envace.core.envs.base import describe_env, env_names

    names = args.names or env_names()
    failed = 0
    for name in names:
        d = describe_env(name)
        print(f"{terminal_safe(name)}  [{terminal_safe(d['source'])}]")
        if d["error"]:
            print(f"  error: {terminal_safe(d['error'])}")
            failed += 1
            continue
        for key in ("tasks", "tools"):
            items = d[key]
            if items is None:
                print(f"  {key}: (not listed)")
                continue
            items = sorted(set(items)) if key == "tools" else items
            shown = ", ".join(terminal_safe(str(i)) for i in (items if args.all else items[:8]))
            more = "" if args.all or len(items) <= 8 else ", ... (--all lists every one)"
            print(f"  {key} ({len(items)}): {shown}{more}")
    return 3 if failed else 0  # listed, but an environment could not be loaded


def _cmd_splits(args: argparse.Namespace) -> int:
    print((DATA_DIR / "splits" / "README.md").read_text())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="envace", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="tasks, splits and real trajectories")
    dsub = data.add_subparsers(dest="data_command", required=True)
    ex = dsub.add_parser("export-real", help="execute ground truth, write real trajectories")
    ex.add_argument("--env", default="bfcl",
                    help="environment: bfcl, agentdojo, tau2 or an installed plugin (see "
                         "`envace envs`)")
    ex.add_argument("--split", choices=(*SPLITS, "all"), default="dev",
                    help="a committed split, or all tasks")
    ex.add_argument("--benchmark-version", default=None,
                    help="AgentDojo benchmark version (default v1.2.2)")
    ex.add_argument("--categories", nargs="+", choices=CATEGORIES, default=list(CATEGORIES),
                    help="BFCL categories")
    ex.add_argument("--domain", default=None,
                    help="τ² domain (--env tau2): airline, retail, telecom, or telecom_full (the "
                         "2,285 generated telecom tasks, --split all only)")
    ex.add_argument("--tasks", nargs="+", help="explicit task ids instead of a split")
    ex.add_argument("--out", required=True, help="output .jsonl")
    ex.add_argument("--no-turn-end", action="store_true",
                    help="omit the empty assistant message that closes each turn")
    ex.add_argument("--call-timeout", type=limit_arg, default=30.0, metavar="S",
                    help="wall-clock limit of every environment call (a child process killed "
                         "past it; the task is skipped, exit 3; default %(default)g; 0: none)")
    ex.add_argument("--call-memory-mb", type=limit_arg, default=4096, metavar="MB",
                    help="memory a call may add to the environment's process (0: no limit)")
    ex.set_defaults(func=_cmd_export_real)
    rec = dsub.add_parser(
        "record", help="an MCP task file's ground truth against its server: real trajectories",
        description="Execute each task's ground truth against a fresh server of an MCP profile "
                    "and write real trajectories (docs/mcp.md). Needs --mcp-config FILE (or "
                    "ENVACE_MCP_CONFIG). Exit 3: written, some tasks skipped.")
    rec.add_argument("--env", required=True, help="mcp:<profile> of the MCP config")
    rec.add_argument("--tasks", required=True, help="task file (JSON lines)")
    rec.add_argument("--out", required=True, help="output .jsonl")
    rec.add_argument("--no-turn-end", action="store_true",
                     help="omit the empty assistant message that closes the turn")
    rec.set_defaults(func=_cmd_record)
    sp = dsub.add_parser("splits", help="print the split note")
    sp.set_defaults(func=_cmd_splits)
    en = sub.add_parser("envs", help="environments installed (built in and plugins): tasks, tools")
    en.add_argument("names", nargs="*", help="only these environments")
    en.add_argument("--all", action="store_true", help="list every task and tool")
    en.set_defaults(func=_cmd_envs)

    for name, module in _EXTRA.items():
        try:
            mod = __import__(module, fromlist=["add_parser"])
        except ImportError:
            continue
        mod.add_parser(sub, name)
    return p


# Subcommands defined next to their code: each module exposes add_parser(subparsers, name).
_EXTRA: dict[str, str] = {
    "sft": "envace.cli.sft",
    "rollout": "envace.cli.rollout",
    "train": "envace.training.command",
    "eval": "envace.cli.evaluate",
    "probe": "envace.cli.probe",
    "board": "envace.cli.board",
}


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand. Ctrl-C, SIGTERM (a cluster's preemption) and SIGHUP end it with one line
    and ``128 + signal`` (130, 143, 129), no traceback (``envace.core.interrupts``)."""
    def body() -> int:
        try:
            return _main(argv)
        except UsageError as exc:  # bad input found deep in a command: one line, exit 2
            if stopping() is not None:
                raise
            print(f"envace: {terminal_safe(exc)}", file=sys.stderr)
            return 2

    return run_command("envace", body, final=argv is None, atomic=False)


def _main(argv: list[str] | None) -> int:
    try:
        argv = take_mcp_options(sys.argv[1:] if argv is None else list(argv))
    except McpOptionError as exc:
        print(f"envace: {terminal_safe(exc)}", file=sys.stderr)
        return 2
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may come after options (`envace train --quiet lr=1e-5 steps=3`)
    if extra and hasattr(args, "overrides") and all(
            "=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    raise SystemExit(main())
