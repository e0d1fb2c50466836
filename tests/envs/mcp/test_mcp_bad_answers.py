"""Issue #39 (B13): an MCP answer that is too long, not text, or holds a lone surrogate is that
call's own clear error at once (never a timeout, never the server's end); the next call works.

The server is a plain JSON-RPC one written here (no SDK), answering ``surrogate`` with the valid
JSON string ``"\\ud800"``, ``big`` with a 30 MB text, ``latin`` with bytes that are no UTF-8 and
``ok`` normally; ``ID_LAST=1`` puts the id at the end of each answer, as Node servers write it.
"""

from __future__ import annotations

import sys
import textwrap
import time

import pytest

from envace.core.envs.mcp.env import McpEnv
from envace.core.envs.mcp.lines import MAX_ANSWER_LINE_BYTES, checked_line
from envace.core.envs.mcp.profile import parse_profile

SERVER = textwrap.dedent('''
    import json, os, sys
    OBJ = {"type": "object", "properties": {}}
    TOOLS = [{"name": n, "description": n, "inputSchema": OBJ}
             for n in ("surrogate", "big", "latin", "ok")]
    out = sys.stdout.buffer
    for line in sys.stdin:
        msg = json.loads(line) if line.strip() else {}
        if "id" not in msg or "method" not in msg:
            continue
        m, p = msg["method"], msg.get("params") or {}
        if m == "initialize":
            r = {"protocolVersion": p.get("protocolVersion", "2025-06-18"),
                 "capabilities": {"tools": {}}, "serverInfo": {"name": "bad", "version": "1"}}
        elif m == "tools/list":
            r = {"tools": TOOLS}
        elif m == "tools/call":
            t = {"surrogate": "\\ud800", "big": "x" * 30_000_000, "latin": "@LATIN@"}
            r = {"content": [{"type": "text", "text": t.get(p["name"], "fine")}]}
        else:
            r = {}
        ans = {"result": r, "jsonrpc": "2.0", "id": msg["id"]} if os.environ.get("ID_LAST") \\
            else {"jsonrpc": "2.0", "id": msg["id"], "result": r}
        out.write(json.dumps(ans).replace("@LATIN@", "caf\\xe9").encode("latin-1") + b"\\n")
        out.flush()
''')


@pytest.mark.parametrize("id_last", [False, True])
def test_bad_answers_are_their_own_errors_and_the_server_goes_on(tmp_path, id_last):
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    env = McpEnv(parse_profile("bad", {
        "command": sys.executable, "args": [str(server)], "timeout_s": 20,
        "startup_timeout_s": 20, **({"env": {"ID_LAST": "1"}} if id_last else {})}))
    try:
        env.reset({"files": {}})
        for tool, why in [("surrogate", "lone surrogate"),
                          ("big", f"{MAX_ANSWER_LINE_BYTES}-byte limit of an answer"),
                          ("latin", "not valid utf-8 text")]:
            t0 = time.monotonic()
            r = env.execute(tool, {})
            assert time.monotonic() - t0 < 10, tool  # before: the 20 s timeout
            assert r.error and why in r.content and "within" not in r.content, r.content
            ok = env.execute("ok", {})  # before: "stopped after an earlier failure"
            assert not ok.error and ok.content == "fine"
    finally:
        env.close()


def test_ordinary_and_stray_lines_pass_unchanged():
    for line in [b'{"jsonrpc": "2.0", "id": 3, "result": {"t": "\\ud83d\\ude00"}}',
                 b"not json-rpc at all \\ud800", b'{"a": "\\ud800"}', b""]:
        assert checked_line(line) == line
