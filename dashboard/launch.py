"""The ``envace-dashboard`` command: serve the dashboard on 127.0.0.1.

    envace-dashboard [ROOT] [--port 8501] [--server.port 8600 --server.address 0.0.0.0 ...]

ROOT defaults to runs/. Runs ``python -m streamlit run dashboard/app.py --server.address
127.0.0.1 --server.headless true ... -- ROOT`` with this interpreter, so the dashboard sees the
same packages (on POSIX the command replaces this process, so stopping it stops the server).
Streamlit's own options (``--server.port``, ``--server.address``, ``--server.headless``,
``--theme.base``, any ``--<section>.<name> VALUE`` or ``--<section>.<name>=VALUE`` that
``streamlit run`` knows) pass through and replace the defaults above; without
``--server.address`` the server binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"
ROOT_ENV = "ENVACE_DASHBOARD_ROOT"  # read by dashboard.ui.root_path before the argument
DEFAULTS = {"server.address": "127.0.0.1", "server.headless": "true",
            "browser.gatherUsageStats": "false", "client.toolbarMode": "minimal"}
_OPTION = re.compile(r"^--([A-Za-z]\w*\.[A-Za-z][\w.]*)(?:=(.*))?$", re.S)


class UsageError(ValueError):
    """A command line the dashboard cannot start from; the message says why."""


def command(root: str, port: int | None = None, python: str | None = None,
            options: dict[str, str] | None = None) -> list[str]:
    """The streamlit command line for ``root`` (the path goes after ``--``); ``options``:
    streamlit settings by name (``{"server.port": "8600"}``), which replace the defaults."""
    settings = dict(DEFAULTS)
    if port is not None:
        settings["server.port"] = str(port)
    settings.update(options or {})
    cmd = [python or sys.executable, "-m", "streamlit", "run", str(APP)]
    for key, value in settings.items():
        cmd += [f"--{key}", value]
    return [*cmd, "--", str(Path(root).expanduser().resolve())]


def split_streamlit_options(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """(our arguments, streamlit's ``--section.name`` options with their values); raises
    UsageError for an option without a value or one streamlit does not know."""
    ours: list[str] = []
    options: dict[str, str] = {}
    i = 0
    while i < len(argv):
        m = _OPTION.match(argv[i])
        if not m:
            ours.append(argv[i])
            i += 1
            continue
        key, value = m.group(1), m.group(2)
        if value is None:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise UsageError(f"--{key} needs a value (--{key} VALUE or --{key}=VALUE)")
            value, i = argv[i + 1], i + 1
        options[key] = value
        i += 1
    if options:
        from streamlit import config

        known = config.get_config_options()
        for key in options:
            if key not in known:
                import difflib

                close = difflib.get_close_matches(key, list(known), n=1)
                hint = f"; did you mean --{close[0]}?" if close else ""
                raise UsageError(f"--{key} is not a streamlit option{hint}")
    return ours, options


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="envace-dashboard", description=__doc__.split("\n")[0],
        epilog="Streamlit's own options (--server.port 8600, --server.address 0.0.0.0, "
               "--server.headless false, ...) pass through to streamlit.")
    p.add_argument("root", nargs="?", default="runs",
                   help="directory of runs or one audit directory (default: runs/)")
    p.add_argument("--port", type=int, default=None, help="port (default: streamlit's 8501)")
    try:
        ours, options = split_streamlit_options(list(sys.argv[1:] if argv is None else argv))
    except UsageError as exc:
        print(f"envace-dashboard: {exc}", file=sys.stderr)
        return 2
    args = p.parse_args(ours)
    if args.port is not None and "server.port" in options \
            and str(args.port) != options["server.port"]:
        print(f"envace-dashboard: --port {args.port} and --server.port "
              f"{options['server.port']} disagree: give one", file=sys.stderr)
        return 2
    if not Path(args.root).is_dir():
        print(f"envace-dashboard: {args.root} is not a directory (give a directory of runs, "
              "or an audit directory)", file=sys.stderr)
        return 2
    env = {**os.environ, ROOT_ENV: str(Path(args.root).resolve())}  # beats a stale shell value
    cmd = command(args.root, args.port, options=options)
    if hasattr(os, "execve") and os.name == "posix":
        os.execve(cmd[0], cmd, env)  # streamlit takes this process over: signals reach it
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
