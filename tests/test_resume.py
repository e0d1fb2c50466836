"""A seeded run killed with SIGKILL after a checkpoint and resumed logs the same metrics as an
uninterrupted run (every figure but wall-clock time and throughput)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def test_sigkill_then_resume_gives_the_same_metrics(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    full = subprocess.run(_cmd(tmp_path, "full"), env=env, capture_output=True, text=True)
    assert full.returncode == 0, full.stderr[-2000:]
    proc = subprocess.Popen(_cmd(tmp_path, "killed"), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    ckpt = tmp_path / "killed" / "checkpoints" / "step_1" / "trainer_state.json"
    deadline = time.time() + 600
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert ckpt.exists(), "the run never reached its second checkpoint"
    assert not (tmp_path / "killed" / "report.md").exists()
    resumed = subprocess.run([sys.executable, "-m", "envace.cli", "train", "--resume",
                              str(tmp_path / "killed"), *ARGS[:-1], "--quiet"],
                             env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = _metrics(tmp_path / "full"), _metrics(tmp_path / "killed")
    assert [r["step"] for r in b] == [0, 1, 2]
    assert a == b
