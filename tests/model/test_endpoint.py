"""Auditing a served world model against real local HTTP servers (the standard library's).

    .venv/bin/python -m pytest -q tests/model/test_endpoint.py

A `ThreadingHTTPServer` speaks the OpenAI routes (`/v1/models`, `/v1/completions`,
`/v1/chat/completions`) and misbehaves on request: non-JSON, the wrong schema, 5xx, 4xx, slow
answers. The client retries what can pass (timeouts, 5xx, nonsense) with backoff and never what
cannot (4xx); the probe records a request that still fails as an unanswered step with its reason;
a server that is down is one line naming the URL and exit code 2. The vLLM server is in
`tests/vllm/test_vllm_endpoint.py`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.core.schema import TrajectoryWriter
from envace.model.endpoint import EndpointClient, EndpointError, normalize_base, request_for
from tests.conftest import ROOT

TINY = ROOT / "data" / "models" / "tiny-sft"

ANSWER = '{"ok": true}'


class FakeOpenAI:
    """Behaviour of the server, changed by the tests; what it saw, counted."""

    def __init__(self) -> None:
        self.mode = "ok"           # ok | nonsense | schema | 500 | 400 | slow | flaky
        self.fail_first = 0        # flaky: this many 503s, then ok
        self.delay = 0.0           # seconds each completion takes
        self.models = ["world"]
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.in_flight = self.max_in_flight = 0
        self.auth: list[str | None] = []

    def completion(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        with self.lock:
            self.requests.append(body)
            n = len(self.requests)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            time.sleep(self.delay)
            mode = self.mode
            if mode == "flaky":
                mode = "500" if n <= self.fail_first else "ok"
            if mode == "slow":
                time.sleep(2.0)
            if mode == "nonsense":
                return 200, b"<html>upstream proxy error</html>"
            if mode == "schema":
                return 200, json.dumps({"result": "no choices here"}).encode()
            if mode == "500":
                return 503, b'{"error": "overloaded"}'
            if mode == "400":
                return 400, b'{"error": {"message": "prompt too long"}}'
            choice = ({"text": ANSWER + "<|im_end|>junk"} if path.endswith("/completions")
                      and "chat" not in path else {"message": {"content": ANSWER}})
            return 200, json.dumps({"choices": [choice]}).encode()
        finally:
            with self.lock:
                self.in_flight -= 1


def _handler(state: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, code: int, data: bytes) -> None:
            # the client may have given up (a timeout): its socket is gone
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [
                    {"id": m, "object": "model"} for m in state.models]}).encode())
            else:
                self._send(404, b'{"error": "not found"}')

        def do_POST(self) -> None:  # noqa: N802
            size = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(size) or b"{}")
            state.auth.append(self.headers.get("Authorization"))
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._send(404, b'{"error": "not found"}')
                return
            self._send(*state.completion(self.path, body))

    return Handler


@pytest.fixture
def server() -> Iterator[tuple[str, FakeOpenAI]]:
    state = FakeOpenAI()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", state
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def dev(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("endpoint") / "dev.jsonl"
    with TrajectoryWriter(path, mode="w") as w:
        for t in export_real(split_tasks("dev")[:2]):
            w.write(t)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client(url: str, **kw: Any) -> tuple[EndpointClient, list[float]]:
    slept: list[float] = []
    kw = {"retries": 3, "timeout_s": 5.0, "backoff_s": 0.01, "max_backoff_s": 0.03, **kw}
    return EndpointClient(url, "world", sleep=lambda s: (slept.append(s), time.sleep(s)),
                          **kw), slept


PROMPT = request_for([{"role": "user", "content": "list files"},
                      {"role": "assistant", "content": "", "tool_calls": [
                          {"id": "c0", "type": "function",
                           "function": {"name": "ls", "arguments": {}}}]}], None, "ls", {})


def test_base_url_and_prompt():
    assert normalize_base("http://h:8000") == "http://h:8000/v1"
    assert normalize_base("http://h:8000/v1/") == "http://h:8000/v1"
    with pytest.raises(ValueError):
        normalize_base("ftp://h/v1")
    assert PROMPT["prompt"].endswith("<|im_start|>tool\n") and "list files" in PROMPT["prompt"]


def test_answers_greedy_cut_at_im_end_and_bounded_concurrency(server):
    url, state = server
    state.delay = 0.1
    client, _ = _client(url)
    assert client.check() == ["world"]
    answers = client.answer_all([PROMPT] * 8, concurrency=3)
    assert [a.text for a in answers] == [ANSWER] * 8 and all(a.attempts == 1 for a in answers)
    assert 1 < state.max_in_flight <= 3
    body = state.requests[0]
    assert body["model"] == "world" and body["temperature"] == 0
    assert body["stop"] == ["<|im_end|>"] and body["prompt"] == PROMPT["prompt"]
    chat_client = EndpointClient(url, "world", api="chat")
    req = request_for([{"role": "user", "content": "hi"}], None, "ls", {"a": 1}, api="chat")
    assert chat_client.ask(req).text == ANSWER
    assert state.requests[-1]["messages"][1]["content"].endswith('Call: ls({"a": 1})\nResponse:')


@pytest.mark.parametrize("mode,reason", [("nonsense", "is not JSON"),
                                         ("schema", "answer has no choices[0].text"),
                                         ("500", "HTTP 503")])
def test_retryable_failures_are_retried_with_backoff_then_reported(server, mode, reason):
    url, state = server
    state.mode = mode
    client, slept = _client(url)
    ans = client.ask(PROMPT)
    assert ans.text is None and reason in ans.error and ans.attempts == 4
    assert len(state.requests) == 4
    assert slept == [0.01, 0.02, 0.03]  # exponential, capped at max_backoff_s


def test_a_key_is_sent_only_from_its_own_variable(server, monkeypatch):
    url, state = server
    monkeypatch.setenv("OPENAI_API_KEY", "not-for-this-server")
    monkeypatch.delenv("ENVACE_ENDPOINT_API_KEY", raising=False)
    assert EndpointClient(url, "world").ask(PROMPT).text == ANSWER
    monkeypatch.setenv("ENVACE_ENDPOINT_API_KEY", "k1")
    assert EndpointClient(url, "world").ask(PROMPT).text == ANSWER
    assert state.auth == [None, "Bearer k1"]


def test_client_errors_are_not_retried(server):
    url, state = server
    state.mode = "400"
    client, slept = _client(url)
    ans = client.ask(PROMPT)
    assert ans.attempts == 1 and slept == [] and "HTTP 400" in ans.error
    assert "prompt too long" in ans.error


def test_flaky_server_recovers_and_timeouts_are_retried(server):
    url, state = server
    state.mode, state.fail_first = "flaky", 2
    client, slept = _client(url)
    ans = client.ask(PROMPT)
    assert ans.text == ANSWER and ans.attempts == 3 and len(slept) == 2
    state.mode, state.requests = "slow", []
    client, slept = _client(url, timeout_s=0.3, retries=1)
    t0 = time.perf_counter()
    ans = client.ask(PROMPT)
    assert ans.text is None and "within 0.3 s" in ans.error and ans.attempts == 2
    assert time.perf_counter() - t0 < 1.5  # the client does not wait for the slow answers


def test_check_names_the_url_when_down_or_model_missing(server):
    url, state = server
    down = f"http://127.0.0.1:{_free_port()}/v1"
    with pytest.raises(EndpointError, match=down.replace(".", r"\.")):
        EndpointClient(down, "world").check()
    state.models = ["other"]
    with pytest.raises(EndpointError, match="does not serve model 'world'.*other"):
        EndpointClient(url, "world").check()


def _cli(*args: str) -> subprocess.CompletedProcess:
    """`envace probe ...` in a fresh interpreter; prints whether torch got imported."""
    code = ("import sys; from envace.cli import main; rc = main(sys.argv[1:]); "
            "print('TORCH', 'torch' in sys.modules); sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_probe_cli_audits_a_served_model_without_torch(server, dev, tmp_path):
    url, state = server
    out = tmp_path / "probe"
    r = _cli("probe", "--endpoint", url, "--model", "world", str(dev), "--out", str(out),
             "--concurrency", "2", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "TORCH False" in r.stdout
    summary = json.loads((out / "summary.json").read_text())
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert summary["audited_model"] == f"endpoint:{url}#world"
    block = summary["endpoint"]
    assert block["model"] == "world" and block["url"] == url and block["api"] == "completions"
    assert block["requests"] == len(steps) == len(state.requests) == summary["counts"]["steps"]
    assert block["unanswered"] == 0 and all(s["rehearsed"] == ANSWER for s in steps)
    assert state.max_in_flight <= 2
    # every prompt is the real history up to the call, opened as a tool turn
    assert all(b["prompt"].endswith("<|im_start|>tool\n") for b in state.requests)


def test_probe_with_a_memory_and_the_hybrid_on_a_served_model(server, dev, tmp_path):
    """--memory: every prompt ends with the memory note, then the open tool header; --hybrid:
    only calls the lookup has no identical twin for reach the server (still without torch)."""
    url, state = server
    train = tmp_path / "train.jsonl"
    with TrajectoryWriter(train, mode="w") as w:
        for t in export_real(split_tasks("train")[:60]):
            w.write(t)
    out = tmp_path / "probe"
    r = _cli("probe", "--endpoint", url, "--model", "world", str(dev), "--out", str(out),
             "--memory", str(train), "--hybrid", str(train), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "TORCH False" in r.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["audited_model"] == f"hybrid(lookup,endpoint:{url}#world+memory(k=3))"
    hybrid = summary["world_model"]["hybrid"]
    assert hybrid["answered_by_model"] == len(state.requests) == summary["endpoint"]["requests"]
    assert hybrid["answered_by_lookup"] + hybrid["answered_by_model"] == summary["counts"]["steps"]
    assert hybrid["answered_by_lookup"] > 0
    noted = [b["prompt"] for b in state.requests
             if "Similar calls and what the real environment returned:" in b["prompt"]]
    assert noted and all(p.endswith("<|im_end|>\n<|im_start|>tool\n") for p in noted)


def test_probe_records_failed_requests_as_unanswered_steps(server, dev, tmp_path):
    url, state = server
    state.mode = "nonsense"
    out = tmp_path / "probe"
    r = _cli("probe", "--endpoint", url, "--model", "world", str(dev), "--out", str(out),
             "--retries", "1", "--limit", "1", "--quiet")
    assert r.returncode == 3, r.stderr[-2000:]
    assert "requests failed" in r.stderr and "Traceback" not in r.stderr
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert steps and all(s["unanswered"] and s["rehearsed"] is None for s in steps)
    assert all("is not JSON" in s["unanswered_reason"] for s in steps)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["unanswered_steps"] == len(steps)
    assert summary["endpoint"]["unanswered"] == len(steps)
    assert len(state.requests) == 2 * len(steps)  # one retry each


def test_probe_with_the_server_down_is_one_line_and_exit_2(dev, tmp_path):
    url = f"http://127.0.0.1:{_free_port()}/v1"
    r = _cli("probe", "--endpoint", url, "--model", "world", str(dev), "--out",
             str(tmp_path / "p"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and url in lines[0], r.stderr
    assert not (tmp_path / "p").exists()
    r = _cli("rollout", "--model", str(ROOT / "data" / "models" / "tiny-sft"), "--mode",
             "simulator", "--simulator-endpoint", url, "--out", str(tmp_path / "r.jsonl"))
    assert r.returncode == 2 and url in r.stderr and "TORCH False" in r.stdout


def test_rollout_with_a_served_simulator(server, tmp_path):
    """`envace rollout --mode simulator --simulator-endpoint`: the server answers every call
    of the tiny SFT policy; its answers are the trajectories' (rehearsed) tool responses."""
    url, state = server
    out = tmp_path / "sim.jsonl"
    r = _cli("rollout", "--model", str(ROOT / "data" / "models" / "tiny-sft"), "--split", "dev",
             "--tasks", "4", "--mode", "simulator", "--simulator-endpoint", url, "--max-turns", "2",
             "--max-new-tokens", "48", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    trajs = [json.loads(x) for x in out.read_text().splitlines()]
    tools = [m for t in trajs for m in t["messages"] if m["role"] == "tool" and m.get("rehearsed")]
    assert len(tools) == len(state.requests) > 0
    assert all(m["content"] == ANSWER for m in tools)
    assert all(t["meta"]["simulator"] == f"endpoint:{url}#world" for t in trajs)


def test_simulator_answers_a_failed_request_with_an_error_as_data(server):
    from envace.model.simulators import EndpointSimulator

    url, state = server
    sim = EndpointSimulator(url, "world", api="completions", retries=0)
    msgs = [{"role": "user", "content": "list files"}]
    assert sim(msgs, [], "ls", {}) == ANSWER and sim.label == f"endpoint:{url}#world"
    state.mode = "400"
    err = json.loads(sim(msgs, [], "ls", {}))
    assert err["error"].startswith("simulator endpoint failed: HTTP 400")
    assert (sim.calls, sim.failures) == (2, 1) and "prompt too long" in sim.last_error


def _local_prompts(dev: Path, budget: int) -> list[list[int]]:
    """The prompts the in-process probe builds for every probed step of `dev` (in order)."""
    from transformers import AutoTokenizer

    from audit.probe import run_probe
    from audit.scoring.settings import AuditOptions
    from envace.model.windows import prompt_ids

    tok = AutoTokenizer.from_pretrained(TINY)
    seen: list[list[int]] = []

    def capture(messages, tools, tool, arguments):
        seen.append(prompt_ids(tok, messages, tools, "tool", budget))
        return ""

    with tempfile.TemporaryDirectory() as d:
        run_probe([str(dev)], d, capture, AuditOptions(progress=False, plots=False))
    return seen


def test_with_the_tokenizer_the_served_probe_sends_the_in_process_prompts(server, dev, tmp_path):
    """--tokenizer: each prompt is the in-process probe's, cut to --context less the answer's
    tokens as SFT windows are, sent as token ids (so a conversation longer than the server's
    context is asked, not refused); without it the whole conversation goes as text."""
    url, state = server
    out = tmp_path / "probe"
    r = _cli("probe", "--endpoint", url, "--model", "world", "--tokenizer", str(TINY),
             "--context", "400", "--max-new-tokens", "64", str(dev), "--out", str(out),
             "--concurrency", "1", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    sent = [b["prompt"] for b in state.requests]
    assert sent and all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in sent)
    assert sorted(map(tuple, sent)) == sorted(map(tuple, _local_prompts(dev, 400 - 64)))
    assert max(len(p) for p in sent) <= 400 - 64
    whole = [request_for(m, t, tool, a)["prompt"] for m, t, tool, a in _requests(dev)]
    assert max(len(p) for p in whole) > 4 * (400 - 64)  # the cut did cut
    summary = json.loads((out / "summary.json").read_text())
    assert summary["endpoint"]["prompt"].startswith("token ids, cut to 400 tokens")
    assert summary["endpoint"]["requests"] == len(sent) == summary["counts"]["steps"]


def _requests(dev: Path) -> list[tuple]:
    from audit.probe import run_probe
    from audit.scoring.settings import AuditOptions

    seen: list[tuple] = []
    with tempfile.TemporaryDirectory() as d:
        run_probe([str(dev)], d, lambda *req: seen.append(req) or "",
                  AuditOptions(progress=False, plots=False))
    return seen


@pytest.mark.parametrize("args,why", [
    (["--model", "x", "--tokenizer", "t"], "--tokenizer is a served model's tokenizer"),
    (["--endpoint", "http://127.0.0.1:9/v1", "--model", "x", "--tokenizer", "t", "--api",
      "chat"], "not with --api chat"),
    (["--endpoint", "http://127.0.0.1:9/v1", "--model", "x", "--tokenizer", "t", "--context",
      "100"], "leaves no room for a prompt"),
    (["--model", "x", "--context", "300"], "at least --max-new-tokens + 64 (320)"),
])
def test_cutting_options_that_cannot_work_are_one_line_and_exit_2(dev, tmp_path, args, why):
    r = _cli("probe", *args, str(dev), "--out", str(tmp_path / "p"))
    assert r.returncode == 2 and why in r.stderr, r.stderr[-1000:]
    assert not (tmp_path / "p").exists()


def test_with_the_tokenizer_a_memory_note_is_cut_as_the_in_process_probe_cuts_it(server, dev,
                                                                                  tmp_path):
    """--memory with --tokenizer --context 400 --max-new-tokens 64: the note is held to the
    characters the in-process probe allows for a 336-token prompt budget (it was 1,200, so the
    cut dropped most notes whole and the served prompts were not the in-process ones)."""
    from transformers import AutoTokenizer

    from audit.worlds.memory import NOTE_TITLE, note_chars

    url, state = server
    train = tmp_path / "train.jsonl"
    with TrajectoryWriter(train, mode="w") as w:
        for t in export_real(split_tasks("train")[:60]):
            w.write(t)
    r = _cli("probe", "--endpoint", url, "--model", "world", "--tokenizer", str(TINY),
             "--context", "400", "--max-new-tokens", "64", "--memory", str(train), str(dev),
             "--out", str(tmp_path / "p"), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    tok = AutoTokenizer.from_pretrained(TINY)
    notes = [text.split(NOTE_TITLE, 1)[1].split("<|im_end|>", 1)[0]
             for text in (tok.decode(b["prompt"]) for b in state.requests) if NOTE_TITLE in text]
    assert notes and max(len(n) for n in notes) <= note_chars(400 - 64) < 1200
    # the prompts carry their notes, cut to fit (1,200-character notes did not fit and were
    # dropped whole: 4 of 11 prompts had one); a note may still not fit beside a long system turn
    assert len(notes) >= len(state.requests) - 1 >= 8


def test_a_tokenizer_without_the_chat_markers_is_one_line_and_exit_2(server, dev, tmp_path):
    """A folder transformers reads as some tokenizer without envace's ChatML markers: before,
    a 60-line traceback from inside the probe (exit 1)."""
    url, state = server
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((TINY / "config.json").read_text())
    r = _cli("probe", "--endpoint", url, "--model", "world", "--tokenizer", str(bare), str(dev),
             "--out", str(tmp_path / "p"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-1500:]
    assert len(r.stderr.strip().splitlines()) == 1 and "cannot use the tokenizer" in r.stderr
    assert not state.requests and not (tmp_path / "p").exists()


def test_a_served_models_default_context_keeps_within_its_positions(tmp_path):
    """A folder without an SFT record: the served default context is capped by its
    config.json's positions, as the in-process default is by the loaded model's."""
    from envace.model.models import context_length

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 1024}))
    assert context_length(folder) == 1024
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert context_length(folder) == 2048
