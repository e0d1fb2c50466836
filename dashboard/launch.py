"""The ``envace-dashboard`` command: serve the dashboard on 127.0.0.1.

    envace-dashboard [ROOT] [--port 8501]        (ROOT defaults to runs/)

Runs ``python -m streamlit run dashboard/app.py --server.address 127.0.0.1
--server.headless true -- ROOT`` with this interpreter, so the dashboard sees the same packages
(on POSIX the command replaces this process, so stopping it stops the server).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"
ROOT_ENV = "ENVACE_DASHBOARD_ROOT"  # read by dashboard.ui.root_path before the argument


def command(root: str, port: int | None = None, python: str | None = None) -> list[str]:
    """The streamlit command line for ``root`` (the path goes after ``--``)."""
    cmd = [python or sys.executable, "-m", "streamlit", "run", str(APP),
           "--server.address", "127.0.0.1", "--server.headless", "true",
           "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]
    if port is not None:
        cmd += ["--server.port", str(port)]
    return [*cmd, "--", str(Path(root).expanduser().resolve())]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="envace-dashboard", description=__doc__.split("\n")[0])
    p.add_argument("root", nargs="?", default="runs",
                   help="directory of runs or one audit directory (default: runs/)")
    p.add_argument("--port", type=int, default=None, help="port (default: streamlit's 8501)")
    args = p.parse_args(argv)
    if not Path(args.root).is_dir():
        print(f"envace-dashboard: {args.root} is not a directory (give a directory of runs, "
              "or an audit directory)", file=sys.stderr)
        return 2
    env = {**os.environ, ROOT_ENV: str(Path(args.root).resolve())}  # beats a stale shell value
    cmd = command(args.root, args.port)
    if hasattr(os, "execve") and os.name == "posix":
        os.execve(cmd[0], cmd, env)  # streamlit takes this process over: signals reach it
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
