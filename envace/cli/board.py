"""`envace board`: score every world model of a models file on every environment.

    envace board --models models.yaml --envs bfcl agentdojo tau2 [mcp:NAME ...] --split dev \
        --out boards/dev [--limit N] [--history both]

Each cell (model x environment) is an ordinary audit directory under `OUT/cells/`; the board is
`OUT/board.json` (docs/spec/board.md), `OUT/board.md` and a chart per environment. Run it again
to resume: a finished cell is never recomputed, a changed model, option or input recomputes
exactly its cells (`envace.evaluation.board`). `--out` is new, empty or a board this command
made; nothing in it is written through a link, and no input is written over
(`envace.evaluation.board_out`). Exit 0 when every cell is done, 3 when a cell failed (the board
holds the others), 2 for a usage error (nothing run, nothing written).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from envace.core.envs.family import family
from envace.core.envs.mcp.options import OPTIONS
from envace.core.errors import EXIT_OK, EXIT_SKIPPED, EXIT_USAGE, UsageError
from envace.core.text import terminal_safe
from envace.evaluation.board import BoardOptions, run_board
from envace.evaluation.board_models import read_models


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="score world models on environments: the board",
                       description=__doc__.split("\n")[0])
    p.add_argument("--models", required=True, help="YAML file: models: {name: options}")
    p.add_argument("--envs", nargs="+", required=True,
                   help="environments: bfcl agentdojo tau2 mcp:<profile> ... (an MCP profile with "
                        "--mcp-config FILE --mcp-tasks FILE, docs/mcp.md)")
    p.add_argument("--split", default="dev", help="the split scored (default dev; never train)")
    p.add_argument("--out", required=True,
                   help="the board's directory: new, empty, or a board this command made "
                        "(resumed)")
    p.add_argument("--limit", type=int, default=0,
                   help="at most this many trajectories per environment (0: all)")
    p.add_argument("--history", choices=["real", "both"], default="real",
                   help="both: every model that generates (a local model, an endpoint) is "
                        "probed given the real history and given its own earlier answers, "
                        "and its cell has own - real divergence (references, the ranker and "
                        "likelihood cells are unchanged)")
    p.add_argument("--plots", action="store_true", help="each cell's audit plots too")
    p.add_argument("--quiet", action="store_true", help="no progress lines (board.log has them)")
    p.set_defaults(func=run_board_cli, prog=f"envace {name}")


def check_split(env: str, split: str) -> None:
    """UsageError unless ``env`` is a known environment with split ``split`` (an MCP profile's
    splits are its task file's: ``--mcp-tasks FILE``)."""
    fam = family(env)
    if not env.startswith("mcp:") and split not in fam.splits:
        raise UsageError(f"{env} has no split {split!r}; its splits: {', '.join(fam.splits)}")
    try:
        fam.split_tasks(split, "task")
    except (ValueError, OSError) as exc:  # TaskFileError is a ValueError
        raise UsageError(f"{env}: {str(exc).splitlines()[0] if str(exc) else exc}") from None


def _inputs(models: str) -> list[str]:
    """The files this board reads that a person gave: the models file and the MCP config and
    task file (``--mcp-config``/``--mcp-tasks``, in the environment by now): never written."""
    return [models, *(os.environ[v] for v in OPTIONS.values() if os.environ.get(v))]


def run_board_cli(args: argparse.Namespace) -> int:
    prog = getattr(args, "prog", "envace board")
    if args.limit < 0:
        print(f"{prog}: --limit must be >= 0", file=sys.stderr)
        return EXIT_USAGE
    if args.split == "train":
        print(f"{prog}: the references and the ranker read the train split: score another "
              "split (dev)", file=sys.stderr)
        return EXIT_USAGE
    twice = sorted({e for e in args.envs if args.envs.count(e) > 1})
    if twice:
        print(f"{prog}: --envs names {', '.join(twice)} twice", file=sys.stderr)
        return EXIT_USAGE
    try:
        models = read_models(args.models)
        for env in args.envs:  # refused before anything runs: an unknown environment or split
            check_split(env, args.split)
    except UsageError as exc:
        print(f"{prog}: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyError as exc:
        print(f"{prog}: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return EXIT_USAGE
    command = shlex.join(["envace", "board", "--models", args.models, "--envs", *args.envs,
                          "--split", args.split, "--out", args.out]
                         + (["--limit", str(args.limit)] if args.limit else [])
                         + (["--history", args.history] if args.history != "real" else []))
    try:
        board = run_board(models, list(args.envs), args.out,
                          BoardOptions(split=args.split, limit=args.limit, plots=args.plots,
                                       quiet=args.quiet, history=args.history),
                          command=command, inputs=_inputs(args.models))
    except UsageError as exc:
        print(f"{prog}: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    failed = [c for c in board.cells if c.status != "done"]
    if not args.quiet:
        print(f"board: {len(board.cells) - len(failed)} of {len(board.cells)} cells done; "
              f"wrote {args.out}/board.json and board.md")
    return EXIT_SKIPPED if failed else EXIT_OK
