"""The ``envace`` console script: :mod:`envace.cli` imported under the command's stop handling,
so a Ctrl-C while it loads ends with one line and exit 130, not a traceback."""

from __future__ import annotations

from envace.core.launch import launch


def main() -> int:
    """``envace``'s entry point."""
    return launch("envace", "envace.cli", atomic=False)
