"""Real, executable environments (BFCL multi-turn, AgentDojo, installed plugins) and tasks."""

from envace.core.envs.base import (
    Environment,
    PluginLoadError,
    ToolKind,
    ToolResult,
    env_names,
    make_env,
    register_env,
)

__all__ = ["Environment", "PluginLoadError", "ToolKind", "ToolResult", "env_names", "make_env",
           "register_env"]
