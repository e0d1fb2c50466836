"""``envace data record``: each task of a task file executed against a fresh server.

    envace data record --env mcp:ledger --mcp-config servers.yaml --tasks tasks.jsonl --out F

Writes one real trajectory per task (``envace.core.envs.mcp.export``). A bad line of the task
file, or a task whose server cannot start, costs that task: it is reported (file, line or task
id, reason) and the others are written; the exit code then says so (3). The output is written
to a temporary file renamed into place, never over the task file.
"""

from __future__ import annotations

import sys
from typing import Any

from envace.core.envs.mcp.env import mcp_env
from envace.core.envs.mcp.export import real_trajectory
from envace.core.envs.mcp.tasks import load_tasks
from envace.core.errors import UsageError
from envace.core.outfile import atomic_output, check_output_file
from envace.core.schema import TrajectoryWriter
from envace.core.text import terminal_safe

EXIT_OK, EXIT_USAGE, EXIT_SKIPPED = 0, 2, 3


def record(env_name: str, tasks_file: str, out: str, turn_end: bool = True
           ) -> tuple[int, list[dict[str, Any]]]:
    """(trajectories written, problems) of recording a task file to ``out``."""
    tasks, problems = load_tasks(tasks_file, env_name)
    n = 0
    with (atomic_output(out, [tasks_file]) as tmp, mcp_env(env_name) as env,
          TrajectoryWriter(tmp, mode="w") as w):
        for task in tasks:
            try:  # a server that cannot start, or a record past the size limits, costs its task
                w.write(real_trajectory(task, env, turn_end))
            except Exception as exc:
                problems.append({"file": tasks_file, "task": task.id,
                                 "reason": f"{type(exc).__name__}: {str(exc)[:300]}"})
                continue
            n += 1
    return n, problems


def run(env_name: str, tasks_file: str, out: str, turn_end: bool = True) -> int:
    """The command: messages on stderr, the exit code."""
    if not env_name.startswith("mcp:"):
        print(f"envace data record: --env must name an MCP profile (mcp:<name>), not "
              f"{terminal_safe(repr(env_name))}; built-in families export with "
              "`envace data export-real`",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        check_output_file(out, [tasks_file])
        n, problems = record(env_name, tasks_file, out, turn_end)
    except UsageError as exc:
        print(f"envace data record: {terminal_safe(exc)}; nothing written", file=sys.stderr)
        return EXIT_USAGE
    for p in problems[:10]:
        where = f"line {p['line']}" if "line" in p else f"task {p['task']}"
        # a server's stderr and error text, a task id, a file name: data, escaped for the tty
        print(f"envace data record: skipped {terminal_safe(p['file'])} {terminal_safe(where)}: "
              f"{terminal_safe(p['reason'])}", file=sys.stderr)
    print(f"wrote {n} real trajectories to {terminal_safe(out)}" + (
        f" ({len(problems)} task(s) skipped)" if problems else ""))
    return EXIT_SKIPPED if problems else EXIT_OK
