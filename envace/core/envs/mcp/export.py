"""An MCP task's ground truth as a real trajectory (``source: "real"``).

One user turn (the task's prompt), each ground-truth call with the server's real response, then
an empty assistant message closing the turn. ``env`` is ``{"name": "mcp:<profile>", "state":
{"files": ...}}``: the initial state inline, so replay needs the profile but no task file.

    traj = real_trajectory(task, env)        # env: an McpEnv of the task's profile, or None
"""

from __future__ import annotations

from typing import Any

from envace.core.envs.mcp.env import mcp_env
from envace.core.envs.mcp.tasks import McpTask
from envace.core.envs.recording import real_record, single_turn_messages
from envace.core.schema import Trajectory


def real_trajectory(task: McpTask, env: Any = None, turn_end: bool = True) -> Trajectory:
    """The task's ground truth executed against a fresh server (``env`` is reset to it)."""
    own = env is None
    env = env if env is not None else mcp_env(task.env_name)
    try:
        env.reset(task)
        messages = single_turn_messages(env, task.opening_messages(), task.calls(), "", turn_end)
        tools = env.tools()
    finally:
        if own:
            env.close()
    return real_record(task.id, task.env_record(), messages, tools,
                       {"category": task.env_name, **({"split": task.split} if task.split else {})})
