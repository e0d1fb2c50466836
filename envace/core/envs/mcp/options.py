"""``--mcp-config FILE`` and ``--mcp-tasks FILE``, accepted by every envace and envace-audit
command that builds environments (anywhere on the command line).

They are taken off the command line before the subcommand parses it and set
``ENVACE_MCP_CONFIG`` / ``ENVACE_MCP_TASKS`` (absolute paths) for this process and every worker
it starts; the config is read and checked at once, so a bad file fails before any work.

    argv = take_mcp_options(sys.argv[1:])    # raises McpOptionError for a bad or missing file
"""

from __future__ import annotations

import os
from pathlib import Path

OPTIONS = {"--mcp-config": "ENVACE_MCP_CONFIG", "--mcp-tasks": "ENVACE_MCP_TASKS"}
HELP = ("MCP environments (mcp:<profile>): --mcp-config FILE names the server profiles, "
        "--mcp-tasks FILE the task file of rollout/train/eval (docs/mcp.md)")


class McpOptionError(ValueError):
    """A missing value, or a config that cannot be read."""


def take_mcp_options(argv: list[str]) -> list[str]:
    """``argv`` without the MCP options, whose values are now in the environment."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in OPTIONS and arg != "--":
            if not eq:
                if i + 1 >= len(argv):
                    raise McpOptionError(f"{name} needs a file")
                value = argv[i + 1]
                i += 1
            _apply(name, value)
        else:
            out.append(arg)
        i += 1
    return out


def _apply(option: str, value: str) -> None:
    if option == "--mcp-config":
        # lazy: loads yaml: kept out of --help
        from envace.core.envs.mcp.profile import ProfileError, use_config

        try:
            use_config(value)
        except ProfileError as exc:
            raise McpOptionError(str(exc)) from None
        return
    path = Path(value)
    if not path.is_file():
        raise McpOptionError(f"--mcp-tasks: no file {value}")
    os.environ[OPTIONS[option]] = str(path.resolve())
