"""Record -> replay -> planted errors, against real MCP servers the tests start.

Four servers: the ledger written without any SDK (plain JSON-RPC), mcp-server-git (PyPI, on the
SDK's MCPServer), @modelcontextprotocol/server-memory and server-filesystem (npm, Node; the
latter's answers name absolute paths, written as {workdir}). For each: the task file
is recorded twice, here and by ``envace data record`` in a fresh process (byte-identical), the
recording replays with zero divergence, and planted wrong responses diverge exactly where
planted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from envace.core.envs.mcp.record import record as record_tasks
from envace.core.schema import TrajectoryWriter, read_trajectories
from tests.envs.mcp.conftest import CONFIG, ROOT, TASKS, node_servers

SERVERS = ["ledger", "git", "memory", "files"]


def record(profile: str, out: Path, seed: int) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": str(seed),
           "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run(
        [sys.executable, "-m", "envace.cli", "data", "record", "--env", f"mcp:{profile}",
         "--mcp-config", str(CONFIG), "--tasks", str(TASKS / f"{profile}.jsonl"),
         "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module", params=SERVERS)
def recorded(request, tmp_path_factory, mcp_config):
    profile = request.param
    if profile in ("memory", "files"):
        node_servers()
    d = tmp_path_factory.mktemp(f"mcp-{profile}")
    # one recording in this process (after whatever ran before it), one in a fresh process with
    # another hash seed: the two must agree byte for byte
    n, problems = record_tasks(f"mcp:{profile}", str(TASKS / f"{profile}.jsonl"),
                               str(d / "run1.jsonl"))
    assert n and not problems
    r = record(profile, d / "run2.jsonl", 2)
    assert r.returncode == 0, r.stderr[-2000:]
    return profile, d / "run1.jsonl", d / "run2.jsonl"


def _trajs(path: Path):
    items = list(read_trajectories(path))
    assert all(i.error is None for i in items)
    return [i.trajectory for i in items]


def test_recordings_in_fresh_processes_are_byte_identical(recorded):
    profile, a, b = recorded
    n_tasks = sum(1 for line in (TASKS / f"{profile}.jsonl").read_text().splitlines() if line)
    trajs = _trajs(a)
    assert len(trajs) == n_tasks
    assert a.read_bytes() == b.read_bytes()
    for t in trajs:  # the state inline, the profile by name: nothing that starts a command
        assert t.env == {"name": f"mcp:{profile}", "state": t.env["state"]}
        assert t.source == "real" and t.tools
        assert all(not st.response.rehearsed for st in t.tool_steps())


def test_recording_replays_with_zero_divergence(recorded, tmp_path):
    _, a, _ = recorded
    s = run_audit([str(a)], tmp_path / "audit", AuditOptions(progress=False, plots=False))
    trajs = _trajs(a)
    assert s["counts"]["trajectories"] == len(trajs) and s["counts"]["skipped"] == 0
    assert s["counts"]["steps"] == sum(len(t.tool_steps()) for t in trajs) > 0
    assert s["counts"]["diverged"] == 0


def test_planted_errors_are_found_exactly(recorded, tmp_path):
    profile, a, _ = recorded
    trajs = _trajs(a)
    planted = set()
    for k, t in enumerate(trajs):
        for st in t.tool_steps()[k % 2::2]:
            st.response.content = st.response.content + " (planted)"
            st.response.rehearsed = True
            planted.add((t.id, st.step))
    path = tmp_path / "planted.jsonl"
    with TrajectoryWriter(path, mode="w") as w:
        for t in trajs:
            w.write(t)
    run_audit([str(path)], tmp_path / "audit", AuditOptions(progress=False, plots=False))
    rows = [json.loads(line) for line in (tmp_path / "audit" / "steps.jsonl").read_text()
            .splitlines()]
    got = {(r["trajectory_id"], r["step"]) for r in rows if r["diverged"]}
    assert planted and got == planted, profile


def test_record_exit_codes(tmp_path, mcp_config, capsys):
    from envace.cli.main import main

    good = (TASKS / "ledger.jsonl").read_text().splitlines()[0]
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(f"{good}\n{{not json\n" + good.replace('"rent"', '"rent2"') + "\n")
    out = tmp_path / "out.jsonl"
    argv = ["data", "record", "--env", "mcp:ledger", "--tasks", str(tasks)]
    assert main([*argv, "--out", str(out)]) == 3  # written, one bad line skipped
    assert "line 2" in capsys.readouterr().err
    assert [t.task_id for t in _trajs(out)] == ["rent", "rent2"]
    before = tasks.read_bytes()
    assert main([*argv, "--out", str(tasks)]) == 2 and tasks.read_bytes() == before
    assert main(["data", "record", "--env", "bfcl", "--tasks", str(tasks), "--out",
                 str(tmp_path / "x.jsonl")]) == 2
    assert main([*argv, "--out", str(out), "--mcp-config", str(tmp_path / "none.yaml")]) == 2
