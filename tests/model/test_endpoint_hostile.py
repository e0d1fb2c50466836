"""Issue #39, the served model: a server that drips one byte a second is cut off at the attempt's
timeout (not per socket read), Ctrl-C ends requests in flight at once, and a redirect to another
host is never followed (the key goes nowhere else). Real sockets on 127.0.0.1."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from envace.model.endpoint import API_KEY_ENV, EndpointClient


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()


class _Drip(BaseHTTPRequestHandler):
    """Answers 200 and then one byte of its body per second (a complete answer in 60 s)."""

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"choices": [{"text": "x" * 60}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            for b in body:
                self.wfile.write(bytes([b]))
                self.wfile.flush()
                time.sleep(1.0)
        except OSError:
            pass

    do_GET = do_POST


@pytest.fixture
def drip() -> Iterator[str]:
    yield from _serve(_Drip)


def test_a_dripping_server_is_cut_off_at_the_attempt_timeout(drip):
    client = EndpointClient(drip, "m", timeout_s=2, retries=0)
    t0 = time.monotonic()
    ans = client.ask({"prompt": "hi"})
    took = time.monotonic() - t0
    assert ans.text is None and "within 2 s" in ans.error
    assert took < 5, took  # before: 60 s (the timeout bounded each read, not the attempt)


def test_abort_ends_requests_in_flight_at_once(drip):
    """What Ctrl-C does (answer_all's handler calls abort): the threads stop now."""
    client = EndpointClient(drip, "m", timeout_s=60, retries=3)
    out: list = []
    t = threading.Thread(target=lambda: out.append(client.answer_all([{"prompt": "a"}] * 2,
                                                                      concurrency=2)))
    t.start()
    time.sleep(1.5)
    t0 = time.monotonic()
    client.abort()
    t.join(10)
    assert not t.is_alive() and time.monotonic() - t0 < 3
    assert all(a.text is None for a in out[0])


def test_ctrl_c_in_answer_all_returns_promptly(drip):
    """Before: Ctrl-C waited for every request in flight to time out (55 s in `envace probe`)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    client = EndpointClient(drip, "m", timeout_s=60, retries=0)
    timer = threading.Timer(1.0, lambda: _interrupt_main())
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            client.answer_all([{"prompt": "a"}] * 3, concurrency=3)
    finally:
        signal.signal(signal.SIGINT, old)
    assert time.monotonic() - t0 < 5


def _interrupt_main() -> None:
    """A real SIGINT to the main thread (as the terminal's Ctrl-C delivers)."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


class _Elsewhere(BaseHTTPRequestHandler):
    """The other host: records every request's Authorization header."""

    seen: list[str | None] = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        _Elsewhere.seen.append(self.headers.get("Authorization"))
        body = json.dumps({"choices": [{"text": "stolen"}], "data": [{"id": "m"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST


def test_a_redirect_to_another_host_is_not_followed(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "sekrit")
    _Elsewhere.seen = []
    other = _serve(_Elsewhere)
    other_url = next(other)

    class Redirect(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.send_response(302)
            # "localhost" is another host name for the same machine: not the configured one
            self.send_header("Location", other_url.replace("127.0.0.1", "localhost")
                             + self.path[len("/v1"):])
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST

    redirecting = _serve(Redirect)
    url = next(redirecting)
    try:
        client = EndpointClient(url, "m", timeout_s=5, retries=2)
        ans = client.ask({"prompt": "hi"})
        assert ans.text is None and "HTTP 302" in ans.error and "not followed" in ans.error
        assert ans.attempts == 1  # not retried either
        with pytest.raises(Exception, match="302"):
            client.check()  # the training side's GET /models
        assert _Elsewhere.seen == []  # the key never reached the other host
    finally:
        for g in (other, redirecting):
            next(g, None)


def test_a_refused_connection_is_a_retried_failure():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    sleeps: list[float] = []
    ans = EndpointClient(f"http://127.0.0.1:{port}/v1", "m", retries=2,
                         sleep=sleeps.append).ask({"prompt": "x"})
    assert ans.text is None and "cannot reach" in ans.error and len(sleeps) == 2


class _Huge(BaseHTTPRequestHandler):
    """Answers 200 with a body that never ends (a chunk at a time, as fast as it is read)."""

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.end_headers()  # no length: the body runs until the connection closes
        try:
            self.wfile.write(b'{"choices": [{"text": "')
            chunk = b"x" * (1 << 20)
            for _ in range(10_000):
                self.wfile.write(chunk)
        except OSError:
            pass


def test_an_endless_answer_is_refused_at_the_size_limit_not_held_in_memory():
    from envace.model.endpoint import MAX_ANSWER_BYTES

    for url in _serve(_Huge):
        t0 = time.monotonic()
        ans = EndpointClient(url, "m", timeout_s=30, retries=2).ask({"prompt": "x"})
        assert ans.text is None and f"{MAX_ANSWER_BYTES}-byte limit" in ans.error, ans.error
        assert time.monotonic() - t0 < 25  # not retried, not read to the timeout


class _Deep(BaseHTTPRequestHandler):
    """Answers a valid JSON body nested 100,000 levels deep (tester round 5, case 6)."""

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b'{"choices":[{"text":"x","extra":' + b"[" * 100_000 + b"]" * 100_000 + b"}]}"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        body = json.dumps({"data": [{"id": "m"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_a_deeply_nested_answer_leaves_its_step_unanswered(tmp_path):
    """Before: a RecursionError from decoding the answer stopped `envace probe --endpoint` with a
    traceback, nothing written. Now that request is unanswered (not retried), the audit written,
    exit 3."""
    import subprocess
    import sys
    from pathlib import Path

    from envace.core.envs.bfcl.tasks import split_tasks
    from envace.core.export import export_real

    dev = tmp_path / "dev.jsonl"
    dev.write_text("".join(t.to_json() + "\n" for t in export_real(split_tasks("dev")[:1])))
    for url in _serve(_Deep):
        r = subprocess.run([sys.executable, "-m", "envace.cli", "probe", str(dev), "--endpoint",
                            url, "--model", "m", "--retries", "2", "--out", str(tmp_path / "o")],
                           capture_output=True, text=True, timeout=300,
                           cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 3, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "nested too deeply" in r.stderr
    rows = [json.loads(x) for x in (tmp_path / "o" / "steps.jsonl").read_text().splitlines()]
    assert rows and all(x["unanswered"] for x in rows)
    assert all("nested too deeply" in x["unanswered_reason"] for x in rows)
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["endpoint"]["retried"] == 0  # the same request would answer the same
