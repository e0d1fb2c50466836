"""A server that crashes, hangs, breaks the protocol or cannot start is an error with a reason,
never a stalled caller; servers are stopped at close, on errors and on Ctrl-C (no orphans).

The servers are the SDK-free ledger (tests/envs/mcp/servers/ledger_server.py, which has
``crash``, ``hang``, ``garbage``, ``picture`` and ``fail`` tools) and, for startup failures,
commands that are not MCP servers at all. A marker argument on each command line finds its
processes in /proc.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from envace.core.envs.base import ToolKind, UnknownEnvironment, make_env
from envace.core.envs.mcp.client import ServerError
from envace.core.envs.mcp.env import McpEnv
from envace.core.envs.mcp.profile import parse_profile
from tests.envs.mcp.conftest import HERE, ROOT, marked_processes

LEDGER = str(HERE / "servers" / "ledger_server.py")


def ledger(marker: str, **extra) -> McpEnv:
    raw = {"command": sys.executable, "args": [LEDGER, marker],
           "env": {"LEDGER_DB": "{workdir}/ledger.json"}, "timeout_s": 2,
           "startup_timeout_s": 20, **extra}
    return McpEnv(parse_profile("ledger", raw))


def gone(marker: str, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not marked_processes(marker):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def env():
    marker = f"envace-test-{uuid.uuid4().hex}"
    e = ledger(marker)
    e.marker = marker
    yield e
    e.close()
    assert gone(marker)


def test_answers_errors_and_content_blocks(env):
    env.reset({"files": {}})
    assert env.execute("add_entry", {"account": "a", "amount": 5}).content == "entry 1 added"
    r = env.execute("picture", {})
    assert not r.error and r.content.startswith("a picture:\n[image image/png, 70 bytes, sha256 ")
    r = env.execute("fail", {})
    assert r.error and r.content == "this tool always fails"  # isError -> an error result
    r = env.execute("reject", {})  # a JSON-RPC error answer: an error result, the server goes on
    assert r.error and r.content == ("Error: MCP server 'ledger' answered reject with JSON-RPC "
                                     "error -32602: rejected by the ledger"), r.content
    assert not env.execute("list_entries", {}).error
    r = env.execute("garbage", {})  # a non-JSON-RPC line on stdout: the SDK skips it
    assert not r.error and r.content == "answered after garbage"
    for tool, args, why in [("balance", {}, "required"), ("balance", {"account": 1}, "string"),
                            ("balance", {"account": "a", "x": 1}, "unexpected"),
                            ("no_such", {}, "unknown tool"), ("balance", [], "object")]:
        r = env.execute(tool, args)
        assert r.error and why in r.content, (tool, args, r.content)
    assert env.tool_kind("add_entry") == ToolKind.WRITE  # observed: the state changed
    assert env.tool_kind("balance") == ToolKind.READ  # the server marks it read-only
    assert env.tool_kind("remove_entry") == ToolKind.WRITE  # never called: it may write
    assert env.execute("remove_entry", {"number": 9}).error  # fails, changes nothing
    assert env.tool_kind("remove_entry") == ToolKind.WRITE  # a failure proves no READ
    assert not env.execute("list_entries", {}).error
    assert env.tool_kind("list_entries") == ToolKind.READ  # succeeded, changed nothing
    assert env.tool_kind("nope") is None


def test_a_hung_call_is_an_error_within_the_timeout_and_the_server_is_stopped(env):
    env.reset({"files": {}})
    assert len(marked_processes(env.marker)) == 1
    t0 = time.monotonic()
    r = env.execute("hang", {})
    took = time.monotonic() - t0
    assert r.error and "no answer within 2 s" in r.content, r.content
    assert took < 2 + 8  # the timeout, then the SDK's bounded shutdown
    assert gone(env.marker, 0.5)  # killed, not left hanging
    r = env.execute("balance", {"account": "a"})
    assert r.error and "stopped after an earlier failure" in r.content
    env.reset({"files": {}})  # a reset brings a fresh server
    assert not env.execute("balance", {"account": "a"}).error


def test_call_timeout_bounds_the_profile_timeout(env):
    env.call_timeout = 0.5
    try:
        env.reset({"files": {}})
        t0 = time.monotonic()
        r = env.execute("hang", {})
        assert r.error and "within 0.5 s" in r.content and time.monotonic() - t0 < 8
        assert r.timeout and not r.crashed  # marked in the audit's step row (#39)
    finally:
        env.call_timeout = None


def test_a_crash_mid_call_is_an_error_with_a_reason(env):
    env.reset({"files": {}})
    r = env.execute("crash", {})
    assert r.error and "Connection closed" in r.content, r.content
    assert r.crashed and not r.timeout  # a dead server, not a call past its limit (#39)
    assert env.execute("list_entries", {}).error
    assert gone(env.marker)


@pytest.mark.parametrize("raw,why", [
    ({"command": "/nonexistent/envace-no-such-server"}, "cannot run"),
    ({"command": sys.executable, "args": ["-c", "import time; time.sleep(60)"],
      "startup_timeout_s": 1}, "within 1 s"),
    ({"command": sys.executable, "args": ["-c", "print('hello, not json-rpc')"]}, "starting"),
    ({"command": sys.executable, "args": [LEDGER], "setup": [["false"]]}, "setup false exited 1"),
])
def test_a_server_that_cannot_start_is_a_clear_error(raw, why):
    marker = f"envace-test-{uuid.uuid4().hex}"
    raw = {**raw, "args": [*raw.get("args", []), marker]}
    e = McpEnv(parse_profile("broken", raw))
    t0 = time.monotonic()
    with pytest.raises(ServerError, match=why.replace("(", r"\(")):
        e.reset({"files": {}})
    assert time.monotonic() - t0 < 20
    r = e.execute("anything", {})
    assert r.error  # never an exception after a failed reset
    e.close()
    assert gone(marker)


def test_task_state_cannot_leave_the_workdir(env):
    for bad in ["../escape.txt", "/etc/passwd", "a/../../b", "./a", ""]:
        with pytest.raises(ValueError):
            env.reset({"files": {bad: "x"}})
    with pytest.raises(ValueError, match="only 'files'"):
        env.reset({"files": {}, "command": "rm -rf /"})


def test_a_trajectory_names_a_profile_but_never_a_command(tmp_path, monkeypatch):
    """Only the config can start a server: an unknown profile is a clear error, and the
    trajectory's own fields are never read as a command."""
    monkeypatch.setenv("ENVACE_MCP_CONFIG", str(HERE / "servers.yaml"))
    with pytest.raises(UnknownEnvironment, match="no MCP profile 'evil'"):
        make_env("mcp:evil")
    monkeypatch.delenv("ENVACE_MCP_CONFIG")
    with pytest.raises(UnknownEnvironment, match="--mcp-config"):
        make_env("mcp:ledger")


CTRL_C = textwrap.dedent("""
    import sys
    from envace.core.envs.mcp.env import McpEnv
    from envace.core.envs.mcp.profile import parse_profile
    envs = []
    for i in range(2):
        e = McpEnv(parse_profile("ledger", {"command": sys.executable,
            "args": [sys.argv[1], sys.argv[2]], "timeout_s": 600}))
        e.reset({"files": {}})
        envs.append(e)
    print("ready", flush=True)
    envs[0].execute("hang", {})
""")


def _default_sigint() -> None:
    """Ctrl-C as a terminal delivers it: a suite started in the background (``cmd &``) runs
    with SIGINT ignored, which its subprocesses would inherit (and then never see it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_every_server(tmp_path):
    marker = f"envace-test-{uuid.uuid4().hex}"
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C, LEDGER, marker], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert len([p for p in marked_processes(marker) if p != proc.pid]) == 2
        time.sleep(0.5)  # inside the hung call
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert gone(marker), marked_processes(marker)


def test_ctrl_c_in_envace_audit_replay_exits_130_without_orphans(tmp_path):
    marker = f"envace-test-{uuid.uuid4().hex}"
    config = tmp_path / "servers.yaml"
    config.write_text(json.dumps({"servers": {"ledger": {
        "command": sys.executable, "args": [LEDGER, marker], "timeout_s": 600}}}))
    call = {"id": "c0", "type": "function", "function": {"name": "hang", "arguments": {}}}
    traj = {"schema": "envace.trajectory/1", "id": "t", "task_id": "t",
            "env": {"name": "mcp:ledger", "state": {"files": {}}}, "source": "policy",
            "messages": [{"role": "user", "content": "wait"},
                         {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c0", "name": "hang",
                          "content": "done", "rehearsed": True}]}
    (tmp_path / "t.jsonl").write_text(json.dumps(traj) + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "audit.cli", "--quiet", "replay",
                             str(tmp_path / "t.jsonl"), "--mcp-config", str(config), "--out",
                             str(tmp_path / "audit")], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 60
        while not marked_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marked_processes(marker), "the server never started"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-1000:]
    assert not Path(tmp_path / "audit").exists()
    assert gone(marker), marked_processes(marker)
