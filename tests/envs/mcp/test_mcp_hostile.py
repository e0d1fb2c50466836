"""Issue 39, the hostile tester's MCP cases (/tmp/hostile5/mcp): a server that attacks envace
through its schemas, its workdir, its error answers, its texts and its children.

- a catastrophic regex in a tool's input schema is the call's error within the limit (never a
  stall), a pattern that does not compile too; the server is not called;
- a FIFO, a socket or a symlink to /dev/zero in the workdir is state by its kind, never opened;
- a huge (sparse) file is state by its size and a bounded hash, read in bounded memory;
- a server's own JSON-RPC error -32000 / -32001 is that call's error: the server goes on;
- a server's stderr reaches the terminal escaped (``envace data record``: a server that cannot
  start, one that crashes mid-call);
- a child the server forked does not outlive the session.

The server is a plain JSON-RPC one written here (no SDK), like the tester's ``liar.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest

from envace.core.envs.mcp import workdir
from envace.core.envs.mcp.env import McpEnv
from envace.core.envs.mcp.profile import parse_profile
from envace.core.envs.mcp.workdir import MAX_HASHED_BYTES, MAX_STATE_ENTRIES, read_state
from tests.envs.mcp.conftest import ROOT, marked_processes

SERVER = textwrap.dedent('''
    import json, os, signal, sys, time
    OBJ = {"type": "object", "properties": {"x": {"type": "string"}}}
    SCHEMAS = {
        "redos": {"type": "object", "properties": {"x": {"type": "string",
                                                         "pattern": "^(a|aa)+$"}}},
        "redos_tester": {"type": "object", "properties": {"x": {"type": "string",
                                                                "pattern": "^(a+)+$"}}},
        "pprops": {"type": "object", "patternProperties": {"^(a|aa)+$": {"type": "string"}},
                   "additionalProperties": False},
        "badpat": {"type": "object", "properties": {"x": {"type": "string", "pattern": "("}}},
        "uniq": {"type": "object", "properties": {"x": {"type": "array", "uniqueItems": True}}},
        "selfref": {"type": "object", "$ref": "#"},
    }
    NAMES = ["ok", "mkfifo", "sparse", "smallerr", "timeerr", "ansierr", "orphan", "leaver",
             "crash",
             *SCHEMAS]
    TOOLS = [{"name": n, "description": n, "inputSchema": SCHEMAS.get(n, OBJ)} for n in NAMES]
    out = sys.stdout.buffer
    def send(obj):
        out.write(json.dumps(obj).encode() + b"\\n"); out.flush()
    def text(t): return {"content": [{"type": "text", "text": t}], "isError": False}
    def call(name, mid):
        open("called-" + name, "w").close()
        if name == "mkfifo":
            import socket
            os.mkfifo("pipe")
            s = socket.socket(socket.AF_UNIX); s.bind("sock")
            os.symlink("/dev/zero", "zero")
            os.symlink("/etc/hostname", "outside")
            return text("made a fifo, a socket and links")
        if name == "sparse":
            with open("big.bin", "wb") as f: f.truncate(1 << 30)
            return text("made 1 GiB sparse")
        if name in ("smallerr", "timeerr"):
            code = -32000 if name == "smallerr" else -32001
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": code, "message": "plain error"}})
            return None
        if name == "ansierr":
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32602,
                  "message": "\\x1b]0;PWN\\x07\\x1b[2J short"}})
            return None
        if name == "crash":
            sys.stderr.write("\\x1b]0;PWN\\x07\\x1b[2J crashing\\n"); sys.stderr.flush()
            os._exit(3)
        if name == "orphan":
            if os.fork() == 0:
                time.sleep(120); os._exit(0)
            return text("forked")
        if name == "leaver":  # a child that leaves the server's process group, deaf to SIGTERM
            if os.fork() == 0:
                os.setpgid(0, 0); signal.signal(signal.SIGTERM, signal.SIG_IGN)
                time.sleep(120); os._exit(0)
            time.sleep(0.2)
            return text("forked")
        return text("fine")
    for line in sys.stdin:
        if not line.strip(): continue
        msg = json.loads(line); m = msg.get("method"); mid = msg.get("id")
        p = msg.get("params") or {}
        if m == "initialize":
            send({"jsonrpc": "2.0", "id": mid, "result": {
                "protocolVersion": p.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}}, "serverInfo": {"name": "liar", "version": "1"}}})
        elif m == "tools/list":
            send({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
        elif m == "tools/call":
            r = call(p.get("name"), mid)
            if r is not None: send({"jsonrpc": "2.0", "id": mid, "result": r})
        elif mid is not None:
            send({"jsonrpc": "2.0", "id": mid, "result": {}})
''')


def liar(tmp_path: Path, marker: str, **extra) -> McpEnv:
    server = tmp_path / "liar.py"
    server.write_text(SERVER)
    return McpEnv(parse_profile("liar", {
        "command": sys.executable, "args": [str(server), marker], "timeout_s": 20,
        "startup_timeout_s": 20, **extra}))


@pytest.fixture
def env(tmp_path):
    marker = f"envace-test-{uuid.uuid4().hex}"
    e = liar(tmp_path, marker)
    e.call_timeout = 2.0
    e.reset({"files": {}})
    yield e
    e.close()


def called(env: McpEnv, tool: str) -> bool:
    return (env.workdir / f"called-{tool}").exists()


def test_a_catastrophic_or_broken_schema_pattern_is_the_calls_error_within_the_limit(env):
    cases = [("redos", {"x": "a" * 40 + "!"}, "pattern"),
             ("redos_tester", {"x": "a" * 40 + "!"}, "does not match"),
             ("pprops", {"a" * 40 + "!": "v"}, "pattern"),
             ("badpat", {"x": "abc"}, "does not compile"),
             ("selfref", {}, "schema"),
             ("uniq", {"x": [{"k": i} for i in range(20000)] + [{"k": 0}]}, "non-unique")]
    for tool, args, why in cases:
        t0 = time.monotonic()
        r = env.execute(tool, args)
        took = time.monotonic() - t0
        # before: a stall for ever (redos) or minutes (uniq); well under a second on a quiet
        # machine, 6 s once under a load of 5, so the bound is one a loaded machine keeps
        assert took < 30, (tool, took)
        assert r.error and why in r.content, (tool, r.content[:300])
        assert not called(env, tool), tool  # refused before the server
    assert not env.execute("ok", {}).error  # the server goes on
    r = env.execute("redos", {"x": "aaaa"})  # a pattern that matches lets the call through
    assert not r.error and called(env, "redos")
    r = env.execute("uniq", {"x": [{"k": i} for i in range(20000)]})
    assert not r.error and called(env, "uniq")


def test_a_fifo_socket_or_link_in_the_workdir_is_state_by_its_kind_never_opened(env):
    assert not env.execute("mkfifo", {}).error
    t0 = time.monotonic()
    files = env.state()["files"]  # before: open() of the FIFO blocked for ever
    assert time.monotonic() - t0 < 5
    assert files["pipe"] == {"kind": "fifo"}
    assert files["sock"] == {"kind": "socket"}
    assert files["zero"] == {"symlink": "/dev/zero"}
    assert files["outside"] == {"symlink": "/etc/hostname"}
    assert not env.execute("ok", {}).error


def test_a_huge_sparse_file_is_read_in_bounded_memory(env):
    before = env.state_hash()
    assert not env.execute("sparse", {}).error
    tracemalloc.start()
    try:
        state = env.state()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * MAX_HASHED_BYTES // 8, peak  # before: the whole GiB (1.1 GB resident)
    big = state["files"]["big.bin"]
    assert big["bytes"] == 1 << 30 and big["hashed_bytes"] == MAX_HASHED_BYTES
    assert env.state_hash() != before
    # a change at the end of the file (inside the hashed tail) changes the state
    with open(env.workdir / "big.bin", "r+b") as f:
        f.seek((1 << 30) - 10)
        f.write(b"changed")
    assert env.state()["files"]["big.bin"]["sha256"] != big["sha256"]


def test_entries_past_the_limit_are_cut_and_said(tmp_path, monkeypatch):
    monkeypatch.setattr(workdir, "MAX_STATE_ENTRIES", 50)  # the real 10,000: same code, slower
    for i in range(55):
        (tmp_path / f"f{i:03d}").write_text("x")
    state = read_state(tmp_path)
    assert len(state["files"]) == 50
    assert "truncated" in state and "more than 50 entries" in state["truncated"]
    assert MAX_STATE_ENTRIES == 10_000


@pytest.mark.parametrize("tool,code", [("smallerr", -32000), ("timeerr", -32001)])
def test_a_servers_own_generic_error_answer_is_the_calls_error_and_it_goes_on(env, tool, code):
    t0 = time.monotonic()
    r = env.execute(tool, {})
    assert time.monotonic() - t0 < 5
    assert r.error and f"JSON-RPC error {code}" in r.content and "plain error" in r.content
    assert not r.timeout and not r.crashed  # before: taken for a closed connection / timeout
    ok = env.execute("ok", {})  # before: "stopped after an earlier failure"
    assert not ok.error and ok.content == "fine"


def test_a_forked_child_of_the_server_does_not_outlive_it(tmp_path):
    marker = f"envace-test-{uuid.uuid4().hex}"
    e = liar(tmp_path, marker)
    e.reset({"files": {}})
    assert e.execute("orphan", {}).content == "forked"
    assert len(marked_processes(marker)) == 2  # the server and its child
    e.close()
    deadline = time.monotonic() + 10
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not marked_processes(marker)  # before: the child lived on with ppid 1


def test_a_child_that_left_the_servers_group_does_not_outlive_it(tmp_path):
    """Round 6: a child that calls setpgid(0, 0) and ignores SIGTERM survived the group kill."""
    marker = f"envace-test-{uuid.uuid4().hex}"
    e = liar(tmp_path, marker)
    e.reset({"files": {}})
    assert e.execute("leaver", {}).content == "forked"
    assert len(marked_processes(marker)) == 2
    e.close()
    deadline = time.monotonic() + 10
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not marked_processes(marker)


def _record(tmp_path: Path, server: str, tasks: list[dict]) -> subprocess.CompletedProcess:
    (tmp_path / "srv.py").write_text(server)
    (tmp_path / "servers.yaml").write_text(
        'servers:\n  liar:\n    command: "{python}"\n    args: ["{config_dir}/srv.py"]\n')
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT),
           "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run(
        [sys.executable, "-m", "envace.cli", "data", "record", "--env", "mcp:liar",
         "--mcp-config", str(tmp_path / "servers.yaml"), "--tasks", str(tmp_path / "tasks.jsonl"),
         "--out", str(tmp_path / "out.jsonl")], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120)


@pytest.mark.parametrize("server,tool", [
    ('import sys\nsys.stderr.write("\\x1b]0;PWNED\\x07\\x1b[2J startup failed\\n")\n'
     'sys.exit(1)\n', "ok"),
    (SERVER, "crash")])
def test_record_prints_a_servers_texts_escaped(tmp_path, server, tool):
    done = _record(tmp_path, server, [{"id": "t", "prompt": "p", "state": {"files": {}},
                                       "ground_truth": [[tool, {}]]}])
    assert done.returncode == 3, done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr, done.stderr
    assert "\\x1b]0;" in done.stderr  # shown, visibly escaped



def test_a_task_file_that_is_a_fifo_or_huge_is_refused_not_read(tmp_path):
    """Round 6: `envace data record --tasks FIFO` hung, `--tasks` on /dev/zero filled memory."""
    import os

    import pytest

    from envace.core.envs.mcp import taskfile

    fifo = tmp_path / "t.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(taskfile.TaskFileError, match="not a regular file|FIFO"):
        taskfile.read_task_file(fifo)
    with pytest.raises(taskfile.TaskFileError):
        taskfile.read_task_file("/dev/zero")
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as fh:
        fh.truncate(taskfile.MAX_TASK_FILE_BYTES + 1)
    with pytest.raises(taskfile.TaskFileError, match="longer than|past|limit|bytes"):
        taskfile.read_task_file(big)
