"""A console script's entry: the command's module imported under its stop handling.

    def main() -> int:                      # audit/entry.py, the `envace-audit` console script
        return launch("envace-audit", "audit.cli")

A command's imports take ~0.1 s (more on a loaded machine). Before this, a Ctrl-C that came
while they ran printed a traceback. Now the import runs inside
:func:`envace.core.interrupts.run_command`, so such a stop ends like one that comes later: one
line and exit 130 (143, 129). This module imports nothing but ``sys`` and ``contextlib`` until
it is called, and a Ctrl-C during :mod:`envace.core.interrupts`' own imports gets the same
line. What remains is Python's own start-up, before the script runs (20-40 ms here); there a
signal ends the process as it would any program, and nothing has been written.
"""

from __future__ import annotations

import contextlib
import sys


def launch(prog: str, module: str, atomic: bool = True) -> int:
    """Import ``module`` and return its ``main()``, every stop on the way ending with the
    command's one line and code (``atomic``: the command renames its outputs into place when
    complete, so a stop leaves an earlier output unchanged). Only for a process that exits
    next: the stop signals stay ignored after it."""
    try:
        import importlib

        # lazy: loaded under the try, so that a Ctrl-C while it loads gets the one line too
        from envace.core.interrupts import run_command
    except KeyboardInterrupt:  # Ctrl-C while the stop handling itself loads
        line = f"{prog}: interrupted; nothing written (an earlier output is unchanged)" \
            if atomic else f"{prog}: interrupted"
        with contextlib.suppress(OSError, ValueError):  # a hung-up terminal refuses it
            print(line, file=sys.stderr, flush=True)
        return 130
    return run_command(prog, lambda: importlib.import_module(module).main(), final=True,
                       atomic=atomic)
