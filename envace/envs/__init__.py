"""Real, executable environments (the BFCL multi-turn backends) and their tasks."""

from envace.envs.base import Environment, ToolKind, ToolResult, make_env, register_env

__all__ = ["Environment", "ToolKind", "ToolResult", "make_env", "register_env"]
