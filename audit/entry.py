"""The ``envace-audit`` console script: :mod:`audit.cli` imported under the command's stop
handling, so a Ctrl-C while it loads ends with one line and exit 130, not a traceback."""

from __future__ import annotations

from typing import TYPE_CHECKING

from envace.core.launch import launch

if TYPE_CHECKING:  # the entry imports as little as it can before launch()
    import argparse


def main() -> int:
    """``envace-audit``'s entry point."""
    return launch("envace-audit", "audit.cli")


def build_parser() -> argparse.ArgumentParser:
    """``envace-audit``'s parser, for tools that walk its subcommands (imported when called)."""
    from audit.cli import build_parser as build  # lazy: the command's modules load only on call

    return build()
