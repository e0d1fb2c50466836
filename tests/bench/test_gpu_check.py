"""The GPU check cannot rot: its CPU dry run runs every stage (at toy sizes) and writes numbers
for each; it fails early, in one line, without a GPU or a wheel; a failing or overrunning stage
keeps the other stages' results; the throughput FLOP count matches the Qwen3 shapes.

    .venv/bin/python -m pytest tests/bench/test_gpu_check.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _num(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x == x  # not NaN


def test_cpu_dry_run_runs_every_stage_with_numbers(tmp_path):
    from scripts.gpu_check import STAGES

    out = tmp_path / "out"
    # caps x4: on cores shared with training jobs the dry run runs several times slower (its
    # stages took 4 of 5 minutes' caps at load 16 on 2 cores); a hung stage still fails
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ENVACE_GPU_CAP_SCALE": "4"}
    r = subprocess.run(["bash", str(SCRIPT), "--cpu-dry-run", str(out)], env=env,
                       capture_output=True, text=True, timeout=1500)
    res = json.loads((out / "gpu_check.json").read_text())
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-2000:])
    assert res["finished"] and res["ok"] and res["mode"] == "cpu-dry-run"
    st = res["stages"]
    assert list(st) == [s.name for s in STAGES]
    for name, s in st.items():
        assert s["status"] == "ok", (name, s)
        assert _num(s["seconds"]) and s["seconds"] <= s["cap_s"] + 20, name
    pre = st["preflight"]
    assert pre["torch"] and pre["transformers"] and pre["python"] and pre["problems"] == []
    gt = st["gpu_tests"]
    assert gt["passed"] == gt["tests"] >= 5 and gt["skipped"] == 0
    measured = {k: v for c in gt["cases"].values() for k, v in c.get("measured", {}).items()}
    for key in ("logprob_max_abs_diff_float32", "logprob_max_abs_diff_bfloat16",
                "update_loss_device", "split_rehearse_max_abs_diff", "resume_steps"):
        assert _num(measured[key]), key
    assert measured["logprob_max_abs_diff_float32"] <= 1e-3
    tp = st["throughput"]
    toy = tp["shapes"]["toy"]
    assert all(_num(r[k]) and r[k] > 0 for r in toy["rollout"]
               for k in ("generated_tokens_per_s", "prefill_tokens_per_s", "peak_memory_gib"))
    assert _num(toy["update"]["tokens_per_s"]) and toy["update"]["tokens_per_s"] > 0
    assert _num(tp["matmul_tflops_measured"]) and tp["peak_tflops_datasheet"] == 989.5
    assert set(tp["tables"]) == {"rollout", "update", "memory_mfu"}
    tr = st["train"]
    assert tr["steps_done"] >= 1 and tr["fidelity_logged"] and tr["audited_steps"] >= 1
    assert _num(tr["seconds_update"]) and _num(tr["peak_memory_gib"])
    assert _num(tr["eval_dev"]["success_rate"])
    assert st["suite"]["passed"] > 0 and st["suite"]["failures"] == 0
    # what the device tool brings back: at most 8 files, flat
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(p.is_file() for p in out.iterdir()), files
    assert "[gpu_check] all stages ok" in r.stdout


def _fake_bin(tmp_path: Path) -> Path:
    """A PATH folder whose nvidia-smi answers, as on a GPU machine."""
    b = tmp_path / "bin"
    b.mkdir()
    smi = b / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: Fake (UUID: x)'\n")
    smi.chmod(0o755)
    return b


@pytest.mark.parametrize("case", ["no_gpu", "no_manifest", "wheel_missing"])
def test_without_a_gpu_or_a_wheel_it_fails_early_in_one_line(tmp_path, case):
    env = {**os.environ, "ENVACE_GPU_WHEELS": str(tmp_path / "wheels")}
    if case == "no_gpu":
        env["PATH"] = "/usr/bin:/bin"  # no nvidia-smi
    else:
        env["PATH"] = f"{_fake_bin(tmp_path)}:/usr/bin:/bin"
    if case == "wheel_missing":
        (tmp_path / "wheels").mkdir()
        (tmp_path / "wheels" / "MANIFEST").write_text("rapidfuzz==3.14.6\n")
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(SCRIPT), str(out)], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    lines = [x for x in r.stdout.splitlines() if "FAILED" in x]
    assert len(lines) == 1
    want = {"no_gpu": "no nvidia-smi", "no_manifest": "scripts/gpu_wheels.sh",
            "wheel_missing": "wheel missing: rapidfuzz==3.14.6"}[case]
    assert want in lines[0]
    res = json.loads((out / "gpu_check.json").read_text())
    assert res["ok"] is False and want in res["reason"] and res["stages"] == {}


def test_a_failing_or_overrunning_stage_keeps_the_others_results(tmp_path, monkeypatch):
    import scripts.gpu_check as gc

    def cmd(code: str):
        return lambda ctx: [sys.executable, "-c", code]

    def collect(ctx, res):
        res["collected"] = 1.0

    monkeypatch.setattr(gc, "STAGES", [
        gc.Stage("first", {"dry": 30}, cmd("print('one')"), collect),
        gc.Stage("broken", {"dry": 30}, cmd("raise SystemExit(3)"), collect),
        gc.Stage("slow", {"dry": 2}, cmd("import time; time.sleep(60)"), collect),
        gc.Stage("last", {"dry": 30}, cmd("print('four')"), collect),
    ])
    res = gc.run_check(tmp_path, dry=True)
    st = res["stages"]
    assert [st[k]["status"] for k in st] == ["ok", "failed", "timeout", "ok"]
    assert st["broken"]["exit_code"] == 3 and st["slow"]["seconds"] < 30
    assert all(st[k]["collected"] == 1.0 for k in st)
    assert not res["ok"] and res["finished"]
    assert json.loads((tmp_path / "gpu_check.json").read_text())["stages"] == st
    log = (tmp_path / "gpu_check.log").read_text()
    assert "one" in log and "four" in log and "===== slow" in log


def test_a_failed_preflight_skips_the_rest_with_its_reason(tmp_path, monkeypatch):
    import scripts.gpu_check as gc

    monkeypatch.setattr(gc, "STAGES", [
        gc.Stage("preflight", {"dry": 30},
                 lambda ctx: [sys.executable, "-c", "print('no CUDA here'); raise SystemExit(1)"],
                 lambda ctx, res: None),
        gc.Stage("gpu_tests", {"dry": 30}, lambda ctx: ["false"], lambda ctx, res: None),
    ])
    st = gc.run_check(tmp_path, dry=True)["stages"]
    assert st["preflight"]["status"] == "failed"
    assert st["gpu_tests"]["status"] == "skipped" and "no CUDA here" in st["gpu_tests"]["reason"]


@pytest.mark.parametrize("shape,params", [("qwen3-0.6b", 0.596e9), ("qwen3-1.7b", 1.72e9)])
def test_throughput_shapes_and_flop_count(shape, params):
    """The shapes are Qwen3's (parameter counts of the released models), and the FLOP count's
    matmul weights are every Linear of the model (lm_head tied to the embeddings)."""
    import torch

    from bench.gpu_throughput import build_model, forward_flops, matmul_params

    model = build_model(shape, torch.device("meta"), torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(params, rel=0.01)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert matmul_params(model.config) == linear
    assert forward_flops(model.config, 10, 0) == 20 * linear


def test_a_rerun_can_select_stages_after_the_preflight(tmp_path, monkeypatch):
    import scripts.gpu_check as gc

    ok = lambda ctx: [sys.executable, "-c", "pass"]  # noqa: E731
    monkeypatch.setattr(gc, "STAGES", [gc.Stage(n, {"dry": 30}, ok, lambda ctx, res: None)
                                       for n in ("preflight", "gpu_tests", "train")])
    res = gc.run_check(tmp_path, dry=True, only={"train"})
    assert list(res["stages"]) == ["preflight", "train"] and res["ok"]
    with pytest.raises(ValueError, match="unknown stages"):
        gc.run_check(tmp_path, dry=True, only={"trian"})


def test_tests_stopped_at_their_cap_are_counted_from_the_log(tmp_path, monkeypatch):
    import scripts.gpu_check as gc

    (tmp_path / "suite.xml").write_text("<testsuite tests='9'/>")  # a previous run's: ignored
    code = ("print('tests/a.py::t1 PASSED'); print('tests/a.py::t2 FAILED', flush=True); "
            "import time; time.sleep(60)")
    monkeypatch.setattr(gc, "STAGES", [gc.Stage(
        "suite", {"dry": 3}, lambda ctx: [sys.executable, "-c", code],
        lambda ctx, res: gc._junit_collect(ctx, res, "suite", skips_fail=False))])
    st = gc.run_check(tmp_path, dry=True)["stages"]["suite"]
    assert st["status"] == "timeout" and st["partial"]
    assert (st["tests"], st["passed"], st["failures"]) == (2, 1, 1)
