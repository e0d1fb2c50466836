"""Errors and exit codes every layer shares (the audit, the runtime and both command lines).

    raise UsageError("--reference needs TRAIN.jsonl")     # bad usage or input: nothing written
    return EXIT_SKIPPED if skipped else EXIT_OK

The exit codes of `envace-audit` and `envace probe` (docs/audit.md, "Formats and exit codes"):
0 everything done; 3 written, but some records skipped (each listed with file, line and reason);
2 bad usage, unreadable input or a refused output (nothing written); 130 Ctrl-C, 143 SIGTERM,
129 SIGHUP (128 + the signal: ``envace.core.interrupts``); 1 only a bug.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_SKIPPED = 3


class UsageError(Exception):
    """Bad usage or unusable input: the command writes nothing (exit code 2)."""
