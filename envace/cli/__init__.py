"""envace.cli: the `envace` command. `main.py` builds the parser; each subcommand lives in its
own module (train, evaluate, rollout, sft, probe) exposing `add_parser(subparsers, name)`."""

from envace.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
