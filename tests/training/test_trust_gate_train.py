"""`envace train rehearse_trust=C`: the confidence gate in training rollouts (the committed tiny
cold start, real BFCL backends, one step): the step's metrics count the calls rehearsed and
those the gate sent to reality, and they are the rollouts' own tool messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ENVACE = [sys.executable, "-m", "envace.cli"]


def test_one_gated_step_counts_the_calls_it_sent_to_reality(tmp_path):
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([*ENVACE, "train", f"output_dir={tmp_path}", "run_name=gate", "steps=1",
                        "prompts_per_step=2", "group_size=2", "eval_tasks=1",
                        "max_new_tokens=48", "max_turns=3", "rehearse_trust=0", "--quiet"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads((tmp_path / "gate" / "metrics.jsonl").read_text().splitlines()[0])
    (rollouts,) = (tmp_path / "gate" / "rollouts").glob("step_*.jsonl")  # the one step's
    tools = [m for line in rollouts.read_text().splitlines()
             for m in json.loads(line)["messages"] if m["role"] == "tool"]
    gated = [m for m in tools if m.get("gated")]
    assert row["calls/gated_real"] == len(gated) > 0
    assert row["calls/rehearsed"] == sum(m["rehearsed"] is True for m in tools)
    assert all(m["rehearsed"] is False for m in gated)


def test_the_gate_is_refused_where_nothing_is_rehearsed(tmp_path):
    r = subprocess.run([*ENVACE, "train", f"output_dir={tmp_path}", "mode=grpo",
                        "rehearse_trust=-1"], capture_output=True, text=True)
    assert r.returncode == 2 and "rehearse_trust" in r.stderr and "does not rehearse" in r.stderr
    r = subprocess.run([*ENVACE, "train", f"output_dir={tmp_path}", "rehearse_trust=0.5"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "rehearse_trust <= 0" in r.stderr
    assert not any(tmp_path.iterdir())
