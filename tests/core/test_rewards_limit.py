"""The reward verifier under the call limit (issue 39): it executes the committed calls for
real, so a call that stalls in C code must cost that episode's reward, never the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from envace.core.envs.limits import CallLimits, CallTimeout, EnvProcessDied, limited_call

ROOT = Path(__file__).resolve().parents[2]

STALL = """
import json, time
from envace.core import rewards
from envace.core.envs.bfcl.tasks import get_task
from envace.core.envs.limits import CallLimits
rewards.VERIFIER_LIMITS = CallLimits(call_timeout_s=3)
task = get_task("multi_turn_base_15")  # involves MathAPI
t = time.monotonic()
r = rewards.task_reward("state", task, [[("square_root", {"number": 2, "precision": 10**7})]])
ok = rewards.task_reward("state", task, [[]])
print(json.dumps([r, round(time.monotonic() - t, 1), ok["reward"]]))
"""


def test_a_committed_call_that_stalls_in_c_costs_its_reward_not_the_run():
    try:
        out = subprocess.run([sys.executable, "-c", STALL], cwd=ROOT, capture_output=True,
                             text=True, timeout=90, env={"PATH": "/usr/bin",
                                                        "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:  # the verifier ran the 127-second C call to its end
        pytest.fail("the verifier was not cut by its call limit")
    assert out.returncode == 0, out.stderr[-800:]
    import json

    r, seconds, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["reward"] == 0.0 and not r["success"] and r.get("timeout"), r
    assert "call limit" in r["detail"]
    assert seconds < 60 and after == 0.0  # the next verification still runs


def _boom() -> None:
    raise ValueError("inside the child")


def _exit() -> None:
    import os

    os._exit(7)


def test_limited_call_returns_raises_and_reports_a_dead_child():
    assert limited_call(sum, ([1, 2, 3],)) == 6
    with pytest.raises(ValueError, match="inside the child"):
        limited_call(_boom, ())
    with pytest.raises(EnvProcessDied, match="exit"):
        limited_call(_exit, ())
    import time

    with pytest.raises(CallTimeout):
        limited_call(time.sleep, (5,), CallLimits(call_timeout_s=0.5))
    assert limited_call(sum, ([1],), CallLimits(call_timeout_s=None, memory_mb=None)) == 1
