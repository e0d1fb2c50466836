"""The likelihood audit through an OpenAI-compatible server, against a local *fake* vLLM
(`FakePromptLogprobs`, the standard library's HTTP server): the parsing of vLLM's
`prompt_logprobs` answer and the clear refusal of servers that cannot return them. The real
vLLM server is in tests/vllm/test_vllm_likelihood.py.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from transformers import AutoTokenizer

from audit.likelihood_probe import scoring_of
from audit.probe import probe_trajectory
from audit.scoring.settings import AuditOptions
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.evaluation.endpoint_likelihood import (
    PromptLogprobsUnsupported,
    probe_endpoint_likelihood,
    token_logprobs,
)
from envace.model.chat import IM_END, encode_text
from envace.model.endpoint import EndpointClient


def fake_logprob(tid: int) -> float:
    """The fake server's log-probability of token ``tid`` (a known answer)."""
    return -((tid % 7) + 1) / 10


class FakePromptLogprobs:
    """A fake server: `vllm` answers as vLLM does, `openai` ignores prompt_logprobs, `400`
    refuses the field."""

    def __init__(self) -> None:
        self.mode = "vllm"
        self.bodies: list[dict[str, Any]] = []

    def answer(self, body: dict[str, Any]) -> tuple[int, bytes]:
        self.bodies.append(body)
        if self.mode == "400":
            return 400, b'{"error": {"message": "Extra inputs are not permitted: prompt_logprobs"}}'
        choice: dict[str, Any] = {"index": 0, "text": "x", "finish_reason": "length"}
        if self.mode == "vllm" and isinstance(body["prompt"], list):
            ids = body["prompt"]
            choice["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": fake_logprob(t), "rank": 1, "decoded_token": "?"}}
                for t in ids[1:]]
        return 200, json.dumps({"choices": [choice]}).encode()


@pytest.fixture
def server() -> Iterator[tuple[str, FakePromptLogprobs]]:
    state = FakePromptLogprobs()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, code: int, data: bytes) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            self._send(200, json.dumps({"data": [{"id": "world"}]}).encode())

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self._send(*state.answer(body))

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", state
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained("data/models/tiny-sft")


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    trajs = list(export_real(split_tasks("dev")[:2]))
    path = tmp_path_factory.mktemp("lk") / "dev.jsonl"
    path.write_text("".join(t.to_json() + "\n" for t in trajs))
    return path, trajs


@pytest.mark.parametrize("context", [2048, 400])
def test_served_figures_are_the_sums_of_the_served_token_logprobs(server, tok, dev, tmp_path,
                                                                   context):
    url, state = server
    path, trajs = dev
    client = EndpointClient(url, "world", retries=0)
    s = probe_endpoint_likelihood(client, tok, [str(path)], tmp_path / "lk",
                                  AuditOptions(progress=False, plots=False), context)
    body = state.bodies[-1]
    assert body["prompt_logprobs"] == 0 and body["max_tokens"] == 1
    assert all(isinstance(t, int) for t in body["prompt"])
    rows = [json.loads(x) for x in (tmp_path / "lk" / "steps.jsonl").read_text().splitlines()]
    stop = tok.convert_tokens_to_ids(IM_END)
    for r in rows:  # the response's own tokens and its end marker, as the fake scored them
        ids = encode_text(tok, r["actual"]) + [stop]
        assert r["likelihood"]["tokens"] == len(ids)
        assert r["likelihood"]["nats"] == pytest.approx(-sum(fake_logprob(t) for t in ids))
    assert s["likelihood_scorer"]["failed_requests"] == 0
    sc = [scoring_of(t, probe_trajectory(t, lambda *a: "x", AuditOptions()).steps)
          for t in trajs]
    n = sum(len(x.targets) for x in sc)
    want = len(trajs) if context == 2048 else n  # one request per trajectory, or per call
    assert s["likelihood_scorer"]["requests"] == want


@pytest.mark.parametrize("mode", ["openai", "400"])
def test_a_server_without_prompt_logprobs_is_refused_clearly(server, tok, dev, tmp_path, mode):
    url, state = server
    state.mode = mode
    with pytest.raises(PromptLogprobsUnsupported, match="cannot return prompt log-probabilities"):
        probe_endpoint_likelihood(EndpointClient(url, "world", retries=0), tok, [str(dev[0])],
                                  tmp_path / "lk", AuditOptions(progress=False), 2048)
    assert not (tmp_path / "lk").exists()  # nothing written


def test_served_confidence_is_the_mean_served_logprob_of_answer_and_end_marker(server, tok, dev,
                                                                              tmp_path):
    """`envace probe --endpoint --confidence`: each answer ("x", the fake's text) is scored on
    the server as a token-id prompt; its confidence is the mean of the served log-probabilities
    of its tokens and the end marker, its minimum the lowest (a known answer)."""
    from envace.evaluation.endpoint_probe import probe_endpoint

    url, state = server
    path, trajs = dev
    client = EndpointClient(url, "world", retries=0)
    s = probe_endpoint(client, [str(path)], tmp_path / "p", AuditOptions(progress=False),
                       confidence=(tok, 2048))
    ids = encode_text(tok, "x") + [tok.convert_tokens_to_ids(IM_END)]
    want = [fake_logprob(t) for t in ids]
    rows = [json.loads(x) for x in (tmp_path / "p" / "steps.jsonl").read_text().splitlines()]
    assert rows and all(r["rehearsed"] == "x" for r in rows)
    for r in rows:
        assert r["confidence"] == pytest.approx(sum(want) / len(want))
        assert r["confidence_min"] == pytest.approx(min(want))
    assert s["endpoint"]["confidence_requests"] == len(rows)
    assert s["endpoint"]["confidence_failed"] == 0 and s["confidence"]["steps"] == len(rows)
    scored = [b for b in state.bodies if "prompt_logprobs" in b]
    asked = [b["prompt"] for b in state.bodies if "prompt_logprobs" not in b]
    assert all(b["prompt_logprobs"] == 0 and b["prompt"][-len(ids):] == ids for b in scored[1:])
    # the answer was generated after the very prompt it is scored after (token ids, cut alike)
    assert all(isinstance(p, list) for p in asked) and len(asked) == len(rows)
    assert sorted(b["prompt"][:-len(ids)] for b in scored[1:]) == sorted(asked)


@pytest.mark.parametrize("mode", ["openai", "400"])
def test_served_confidence_refuses_a_server_without_prompt_logprobs(server, tok, dev, tmp_path,
                                                                     mode):
    from envace.evaluation.endpoint_probe import probe_endpoint

    url, state = server
    state.mode = mode
    with pytest.raises(PromptLogprobsUnsupported, match="cannot return prompt log-probabilities"):
        probe_endpoint(EndpointClient(url, "world", retries=0), [str(dev[0])], tmp_path / "p",
                       AuditOptions(progress=False), confidence=(tok, 2048))
    assert not (tmp_path / "p").exists()


def test_parser_refuses_what_is_not_a_token_logprob():
    good = {"choices": [{"prompt_logprobs": [None, {"5": {"logprob": -1.5}}]}]}
    assert token_logprobs(good, [3, 5]) == [None, -1.5]
    assert token_logprobs({"choices": [{"prompt_logprobs": [None, {"5": -9999.0}]}]},
                          [3, 5])[1] == float("-inf")
    for bad in ({"choices": [{"text": "x"}]},
                {"choices": [{"prompt_logprobs": [None, {"6": {"logprob": -1.0}}]}]},
                {"choices": [{"prompt_logprobs": [None]}]},
                {"choices": [{"prompt_logprobs": [None, {"5": {"logprob": "a"}}]}]},
                {"choices": [{"prompt_logprobs": [None, {"5": {"logprob": 0.5}}]}]}):
        with pytest.raises(ValueError):
            token_logprobs(bad, [3, 5])
