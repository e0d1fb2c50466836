"""Named counters as an envace environment: the worked example of docs/plugins.md.

    from envace.core.envs.base import make_env
    env = make_env("counter")             # found through the entry point in pyproject.toml
    env.reset("visitors")
    env.execute("increment", {"name": "visitors", "by": 2}).content    # '{"visitors": 5}'
"""

from __future__ import annotations

from typing import Any

from envace.core.envs.methods import MethodEnv, tool


class CounterEnv(MethodEnv):
    """Counters by name; every tool is a method marked with @tool."""

    name = "counter"
    TASKS = {
        "visitors": {
            "state": {"counters": {"visitors": 3}},
            "prompt": "Two more visitors came in. How many visitors are there now?",
            "ground_truth": [["increment", {"name": "visitors", "by": 2}],
                             ["get", {"name": "visitors"}]],
        },
        "new_counter": {
            "state": {"counters": {}},
            "prompt": "Start counting cups of coffee: I just had my first one.",
            "ground_truth": [["increment", {"name": "coffee"}], ["list_counters", {}]],
        },
        "tidy_up": {
            "state": {"counters": {"old": 7, "visitors": 1}},
            "prompt": "Remove the counter called old, then show me what is left.",
            "ground_truth": [["remove", {"name": "old"}], ["list_counters", {}]],
        },
    }

    def setup(self, state: dict[str, Any]) -> None:
        self.counters: dict[str, int] = dict(state.get("counters", {}))

    @tool
    def increment(self, name: str, by: int = 1) -> dict:
        """Add `by` (default 1) to the counter `name`, creating it at 0 if needed."""
        self.counters[name] = self.counters.get(name, 0) + by
        return {name: self.counters[name]}

    @tool
    def get(self, name: str) -> dict:
        """The value of the counter `name`."""
        if name not in self.counters:
            raise KeyError(f"no counter named {name!r}")
        return {name: self.counters[name]}

    @tool
    def list_counters(self) -> dict:
        """Every counter and its value."""
        return dict(sorted(self.counters.items()))

    @tool(writes=True)
    def remove(self, name: str) -> str:
        """Delete the counter `name`."""
        if self.counters.pop(name, None) is None:
            raise KeyError(f"no counter named {name!r}")
        return f"removed {name}"
