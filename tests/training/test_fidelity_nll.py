"""fidelity_nll_every: the world model's bits per byte on held-out real trajectories, logged while
training, is the likelihood audit's pooled figure (a known answer) on the steps it is due."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from audit.scoring.settings import AuditOptions
from envace.core.schema import TrajectoryWriter
from envace.evaluation.likelihood import probe_likelihood
from envace.evaluation.model_probe import context_length
from envace.model.models import load_model
from envace.training.fidelity_nll import due, held_out_batch, held_out_tasks, score_held_out

ENVACE = [sys.executable, "-m", "envace.cli"]
TINY_SFT = Path(__file__).resolve().parents[2] / "data" / "models" / "tiny-sft"
SMALL = ("prompts_per_step=2", "group_size=2", "eval_tasks=1", "max_new_tokens=12",
         "max_turns=2", "--quiet")


def _train(tmp_path: Path, name: str, *args: str) -> list[dict]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([*ENVACE, "train", f"output_dir={tmp_path}", f"run_name={name}",
                        f"model={TINY_SFT}", *args, *SMALL], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


@given(st.integers(0, 30), st.integers(0, 5), st.integers(1, 30))
def test_due_every_k_steps_from_zero_and_on_the_last(step, every, steps):
    expect = every > 0 and (step % every == 0 or step == steps - 1)
    assert due(step, every, steps) == expect


def test_the_held_out_tasks_are_fixed_and_in_split_order():
    tasks = list(range(50))
    a = held_out_tasks(tasks, 8)
    assert a == held_out_tasks(tasks, 8) == sorted(a) and len(set(a)) == 8
    assert held_out_tasks(tasks, 80) == tasks


def test_curve_is_logged_when_due_and_equals_the_likelihood_audit(tmp_path):
    """A 3-step run with fidelity_nll_every=2 and a held-out batch of 2: ``fidelity_bpb`` on
    steps 0 and 2 (the last), ``fidelity_bpb_end`` on the last, nothing on step 1; step 0's
    figure is ``envace probe --likelihood``'s pooled bits per byte of the starting model on the
    same two real dev trajectories."""
    rows = _train(tmp_path, "nll", "steps=3", "fidelity_nll_every=2", "fidelity_nll_batch=2",
                  "lr=1e-3")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [("fidelity_bpb" in r) for r in rows] == [True, False, True]
    assert [("fidelity_bpb_end" in r) for r in rows] == [False, False, True]
    for key in ("fidelity_bpb", "fidelity_bpb_end"):
        r = rows[2]
        assert math.isfinite(r[key]) and r[key] > 0 and r[f"{key}_tokens"] > 0
    assert rows[0]["time/fidelity_nll"] > 0 and rows[1]["time/fidelity_nll"] == 0
    report = (tmp_path / "nll" / "report.md").read_text()
    assert (f"| fidelity_bpb (held-out, before / after training) | {rows[0]['fidelity_bpb']:.3f}"
            f" | {rows[2]['fidelity_bpb_end']:.3f} |") in report
    # known answer: the audit of the same model on the same trajectories
    held = held_out_batch("bfcl", "dev", 2)
    path = tmp_path / "held.jsonl"
    with TrajectoryWriter(path, mode="w") as w:
        for t in held.trajectories:
            w.write(t)
    model, tok = load_model(TINY_SFT)
    context = context_length(TINY_SFT, model)
    summary = probe_likelihood(model, tok, [str(path)], tmp_path / "probe", AuditOptions(),
                               context)
    point = summary["likelihood"]["bits_per_byte"]["point"]
    assert rows[0]["fidelity_bpb"] == pytest.approx(point, rel=1e-5)
    assert rows[0]["fidelity_bpb_steps"] == summary["likelihood"]["steps"]
    direct = score_held_out(model, tok, held, context)
    assert direct["fidelity_bpb"] == pytest.approx(point, rel=1e-5)
    assert model.training is False  # load_model's eval mode is kept
    model.train()
    score_held_out(model, tok, held, context)
    assert model.training  # and a training model is given back in training mode
    # the update moved the weights: the trained model's figure differs from the start's
    assert rows[2]["fidelity_bpb_end"] != rows[0]["fidelity_bpb"]


def test_no_curve_when_off(tmp_path):
    rows = _train(tmp_path, "off", "steps=1")
    assert not any(k.startswith("fidelity_bpb") for k in rows[0])
    assert "fidelity_bpb" not in (tmp_path / "off" / "report.md").read_text()
    assert rows[0]["time/fidelity_nll"] == 0
