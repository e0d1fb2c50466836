"""envace.model.vllm_server: start, wait, fail with the log, and stop the whole process group.

The start/poll/stop logic is tested here against a **stand-in server** (a few lines of Python's
``http.server`` answering ``/v1/models``, which forks a sleeping child as vLLM forks its engine),
because the main suite has no vLLM; the real server is started through the same helper by the
vLLM lane (tests/vllm/test_vllm_endpoint.py, test_vllm_likelihood.py) and `bench.board_run`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from envace.model.vllm_server import (
    ServerError,
    VLLMServer,
    free_port,
    server_command,
    serves,
)

STAND_IN = r'''
import http.server, json, os, subprocess, sys, time
port, name, delay, child_pid_file = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(child_pid_file, "w").write(str(child.pid))
print("stand-in server starting", flush=True)
if name == "EXIT":
    print("fatal: no such model", flush=True)
    sys.exit(3)
time.sleep(delay)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": name}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not reaped by its parent) counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def _gone(pid: int, within: float = 10.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def _launch(tmp_path: Path, served: str, listed: str, delay: float = 0.0,
            deadline: float = 30.0) -> tuple[VLLMServer, Path]:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    port = free_port()
    pid_file = tmp_path / "child.pid"
    cmd = [sys.executable, str(script), str(port), listed, str(delay), str(pid_file)]
    srv = VLLMServer.launch(cmd, f"http://127.0.0.1:{port}/v1", served, tmp_path / "server.log",
                            deadline_s=deadline, poll_s=0.1)
    return srv, pid_file


def test_waits_until_the_model_is_served_and_stops_the_whole_group(tmp_path: Path) -> None:
    srv, pid_file = _launch(tmp_path, "m", "m", delay=0.5)
    child = int(pid_file.read_text())
    try:
        assert srv.startup_s >= 0.5
        assert serves(srv.url, "m") and not serves(srv.url, "other")
    finally:
        srv.stop()
    assert srv.proc.poll() is not None
    assert _gone(child), "the server's child outlived stop()"
    srv.stop()  # idempotent


def test_a_server_that_exits_raises_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match=r"exited \(3\)[\s\S]*fatal: no such model"):
        _launch(tmp_path, "m", "EXIT")
    assert _gone(int((tmp_path / "child.pid").read_text()))


def test_a_server_past_its_deadline_is_stopped(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match=r"did not serve 'm' in 1 s[\s\S]*stand-in server"):
        _launch(tmp_path, "m", "not-m", deadline=1.0)  # answers, but never lists `m`
    assert _gone(int((tmp_path / "child.pid").read_text()))


def test_the_server_command_carries_the_lane_flags() -> None:
    cmd = server_command("/m", "x", 8123, python="py", max_model_len=4096, max_num_seqs=4)
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    def flag(name: str) -> str:
        return cmd[cmd.index(name) + 1]

    assert flag("--model") == "/m" and flag("--served-model-name") == "x"
    assert flag("--port") == "8123" and flag("--host") == "127.0.0.1"
    assert flag("--dtype") == "float32" and flag("--seed") == "0"
    assert flag("--max-model-len") == "4096" and flag("--max-num-seqs") == "4"
    assert "--enforce-eager" in cmd
    assert server_command("/m", "x", 1, python="py", nice=10)[:4] == ["nice", "-n", "10", "py"]
