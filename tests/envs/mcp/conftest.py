"""What the MCP bridge's tests share: the test profiles (servers.yaml) and their servers.

The Node reference servers are installed into tests/envs/mcp/node by scripts/setup.sh
(``npm ci``); a test that needs them installs them itself when they are missing and npm is on the
machine, and is skipped (with the reason) only where Node is not installed at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "servers.yaml"
TASKS = HERE / "tasks"
NODE_DIR = HERE / "node"
ROOT = HERE.parents[2]


def node_servers() -> None:
    """Make sure the Node servers are installed (npm ci), or skip the calling test."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js is not installed (Debian: apt-get install nodejs npm)")
    if not (NODE_DIR / "node_modules" / "@modelcontextprotocol" / "server-memory").is_dir():
        subprocess.run(["npm", "ci", "--prefix", str(NODE_DIR), "--no-audit", "--no-fund",
                        "--loglevel=error"], check=True, capture_output=True, timeout=600)


def marked_processes(marker: str) -> list[int]:
    """Pids of live processes whose command line contains ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                "utf-8", "replace")
            state = (entry / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="module")
def mcp_config():
    """ENVACE_MCP_CONFIG set to the test profiles for the module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ENVACE_MCP_CONFIG", str(CONFIG))
        yield CONFIG
