"""Classify every BFCL tool as READ or WRITE by observation, into data/bfcl_tool_kinds.json.

    .venv/bin/python scripts/tool_kinds.py

A tool is WRITE if any of its ground-truth calls over the 800 tasks changed the backend state
(state hash before != after); READ if it was called and never did. Tools never called in the
ground truth are left out: the adapter falls back to a verb list for them
(envace/core/envs/bfcl/env.py).
"""

from __future__ import annotations

import argparse
import json

from envace.core.envs.bfcl.env import TOOL_KINDS_FILE, BFCLEnv
from envace.core.envs.bfcl.tasks import load_tasks
from envace.core.envs.bfcl.verify import ground_truth_calls

# Changes state that the hash does not see (a private attribute) but later responses depend on.
OVERRIDES = {"cd": "write"}  # GorillaFileSystem._current_dir


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    env = BFCLEnv()
    changed: dict[str, bool] = {}
    for task in load_tasks().values():
        if task.long_context:  # same tools, far larger state: hashing adds nothing
            continue
        env.reset(task)
        for turn in ground_truth_calls(task, env):
            for name, args in turn:
                before = env.state_hash()
                env.execute(name, args)
                changed[name] = changed.get(name, False) or env.state_hash() != before
    kinds = {k: OVERRIDES.get(k, "write" if v else "read") for k, v in sorted(changed.items())}
    TOOL_KINDS_FILE.write_text(json.dumps(kinds, indent=1) + "\n")
    print(f"{sum(v == 'write' for v in kinds.values())} write, "
          f"{sum(v == 'read' for v in kinds.values())} read tools -> {TOOL_KINDS_FILE}")


if __name__ == "__main__":
    main()
