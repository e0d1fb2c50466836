"""A test environment with hostile tools, registered as ``test-hostile`` on import: tools
that end their own process, eat memory, stall in Python, or answer normally (a counter). The
guard forks, so its child has it, as audit workers do. Shared by the guard's tests."""

from __future__ import annotations

import json
import os
import signal
import time

from envace.core.envs.base import ToolKind, ToolResult, register_env


@register_env("test-hostile")
class HostileEnv:
    """Tools that end their own process, eat memory, stall in Python, or answer normally."""

    name = "test-hostile"

    def __init__(self) -> None:
        self.n = 0

    def reset(self, task):
        if task == "refuse":
            raise ValueError("no such task")
        self.n = 0
        if task == "half":  # a reset that fails after it changed the state
            raise ValueError("half-done reset")

    def tools(self):
        return []

    def tool_names(self):
        return {"count", "die", "segv", "eat", "sleep"}

    def execute(self, tool, arguments):
        if tool == "die":
            os._exit(7)
        if tool == "segv":
            import faulthandler

            faulthandler.disable()  # pytest's handler would print the child's stack
            os.kill(os.getpid(), signal.SIGSEGV)
        if tool == "eat":
            blob = bytearray(int(arguments.get("mb", 8192)) * 1024 * 1024)
            return ToolResult(str(len(blob)))
        if tool == "sleep":
            time.sleep(float(arguments.get("s", 60)))
        self.n += 1
        return ToolResult(json.dumps({"n": self.n}))

    def state(self):
        return {"n": self.n}

    def state_hash(self):
        return str(self.n)

    def tool_kind(self, tool):
        return ToolKind.WRITE
