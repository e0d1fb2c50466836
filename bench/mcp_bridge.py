"""What the MCP bridge costs: a server's start (reset: workdir, setup, spawn, initialize,
tools/list) and calls per second through the SDK client on its background loop, per test server.

    python -m bench.mcp_bridge [--calls 200] [--resets 5] [--profiles ledger git memory]

Writes bench/results/mcp_bridge.json (medians; the load average beside them). Each call includes
the state hash of the workdir before and after (how READ/WRITE is observed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from bench.machine import run_record, table, write_result

CONFIG = Path(__file__).resolve().parents[1] / "tests" / "envs" / "mcp" / "servers.yaml"
CALLS = {
    "ledger": ("balance", {"account": "cash"}),
    "git": ("git_status", {"repo_path": "{workdir}"}),
    "memory": ("read_graph", {}),
}


def measure(profile: str, calls: int, resets: int) -> dict[str, float]:
    from envace.core.envs.mcp.env import McpEnv

    env = McpEnv(profile, config=str(CONFIG))
    state = {"files": {"README.md": "hello\n"}}
    try:
        starts = []
        for _ in range(resets):
            t0 = time.perf_counter()
            env.reset(state)
            starts.append(time.perf_counter() - t0)
        tool, args = CALLS[profile]
        assert not env.execute(tool, args).error
        t0 = time.perf_counter()
        for _ in range(calls):
            env.execute(tool, args)
        per_s = calls / (time.perf_counter() - t0)
    finally:
        env.close()
    return {"reset_s_median": statistics.median(starts), "calls_per_s": per_s,
            "tool": tool}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--resets", type=int, default=5)
    p.add_argument("--profiles", nargs="+", default=list(CALLS))
    args = p.parse_args(argv)
    load = os.getloadavg()
    rows = {name: measure(name, args.calls, args.resets) for name in args.profiles}
    print(table([[n, r["tool"], r["reset_s_median"], r["calls_per_s"]] for n, r in rows.items()],
                ["profile", "tool", "reset s (median)", "calls/s"]))
    write_result("mcp_bridge", {**run_record("bench.mcp_bridge", argv, load),
                                "calls": args.calls, "resets": args.resets, "profiles": rows,
                                "note": "reset = fresh workdir + setup commands + server spawn "
                                        "+ initialize + tools/list; a call includes two state "
                                        "hashes of the workdir; servers of "
                                        "tests/envs/mcp/servers.yaml"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
