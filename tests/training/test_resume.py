"""A seeded run killed with SIGKILL after a checkpoint and resumed logs the same metrics as an
uninterrupted run (every figure but wall-clock time and throughput), with and without a KL to
the initial policy (whose anchor must not move to the checkpoint resumed from); a run without
its anchor is not resumed with a KL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

ARGS = [f"model={ROOT / 'data' / 'models' / 'tiny-sft'}", "steps=3", "prompts_per_step=2",
        "group_size=2", "max_new_tokens=24", "max_turns=2", "checkpoint_every=1",
        "eval_tasks=1", "lr=1e-3", "--quiet"]
TIMING = ("time", "tokens_per_s", "seconds/")


def _cmd(out: Path, name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "envace.cli", "train", *ARGS, f"output_dir={out}",
            f"run_name={name}", *extra]


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


@pytest.mark.parametrize("extra", [[], ["kl_coef=0.05"]], ids=["no_kl", "kl"])
def test_sigkill_then_resume_gives_the_same_metrics(tmp_path, extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    full = subprocess.run(_cmd(tmp_path, "full", *extra), env=env, capture_output=True, text=True)
    assert full.returncode == 0, full.stderr[-2000:]
    proc = subprocess.Popen(_cmd(tmp_path, "killed", *extra), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    ckpt = tmp_path / "killed" / "checkpoints" / "step_1" / "trainer_state.json"
    deadline = time.time() + 600
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert ckpt.exists(), "the run never reached its second checkpoint"
    assert not (tmp_path / "killed" / "report.md").exists()
    resume = [sys.executable, "-m", "envace.cli", "train", "--resume", str(tmp_path / "killed"),
              *ARGS[:-1], *extra, "--quiet"]
    resumed = subprocess.run(resume, env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = _metrics(tmp_path / "full"), _metrics(tmp_path / "killed")
    assert [r["step"] for r in b] == [0, 1, 2]
    assert a == b
    anchor = tmp_path / "killed" / "initial_model"
    assert anchor.is_dir() == bool(extra)  # kept only for a KL
    if extra:
        assert b[-1]["kl_ref"] > 0  # the resumed step measured a KL, to the same anchor
        # a run made before the anchor was kept: refused, saying why, and left as it was
        shutil.rmtree(anchor)
        again = subprocess.run(resume, env=env, capture_output=True, text=True)
        assert again.returncode == 2
        assert "initial_model" in again.stderr and "anchor the KL" in again.stderr
        assert _metrics(tmp_path / "killed") == b
