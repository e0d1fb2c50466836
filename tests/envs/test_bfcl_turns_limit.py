"""Issue #39: per-turn tasks execute the ground truth of the turns before them, and that
execution is an environment call like any other: under the call limits, C code included.

A task whose earlier turn's ground truth is BFCL's own ``square_root(number=2,
precision=10**7)`` (127 s inside ``decimal``'s C code) is left out of the split at the limit,
named on stderr; the other tasks' turns are derived as before, and no process is left behind.
"""

from __future__ import annotations

import dataclasses
import time

import psutil

from envace.core.envs.bfcl import turns
from envace.core.envs.bfcl.tasks import get_task
from envace.core.envs.limits import CallLimits
from envace.core.envs.task_common import GroundTruthCall, format_call

STALL = {"number": 2, "precision": 10**7}


def _stalling(task_id: str):
    task = get_task(task_id)
    call = GroundTruthCall(format_call("square_root", STALL), "square_root", (), dict(STALL))
    return dataclasses.replace(task, id=task_id + "_stall",
                               ground_truth=[[call], *task.ground_truth[1:]])


def test_a_ground_truth_that_stalls_costs_its_task_not_the_split(monkeypatch, capsys):
    monkeypatch.setattr(turns, "TURN_LIMITS", CallLimits(1.5, None))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    fine = get_task("multi_turn_base_47")
    t0 = time.monotonic()
    out = turns.turn_tasks([_stalling("multi_turn_base_32"), fine])
    assert time.monotonic() - t0 < 20
    assert {t.base_id for t in out} == {fine.id}
    assert [t.id for t in out] == [f"{fine.id}@t{k}" for k, gt in enumerate(fine.ground_truth)
                                   if gt]
    err = capsys.readouterr().err
    assert "multi_turn_base_32_stall left out" in err and "call limit of 1.5 s" in err
    time.sleep(0.2)
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()


def test_turns_derived_under_the_limit_equal_those_derived_in_process():
    task = get_task("multi_turn_base_0")
    from envace.core.envs.bfcl.env import BFCLEnv

    plain = turns.ground_truth_messages(task, BFCLEnv())
    assert turns.ground_truth_messages(task) == plain
    for k in range(len(task.turns)):
        assert turns.derive_turn_task(task, k) == turns.derive_turn_task(task, k, plain)


def test_the_cold_starts_train_export_is_under_the_limit(monkeypatch, capsys):
    from envace.training import sft

    fine = get_task("multi_turn_base_47")
    monkeypatch.setattr(sft, "train_tasks", lambda env="bfcl": [_stalling("multi_turn_base_32"),
                                                                  fine])
    t0 = time.monotonic()
    out = sft.load_train_trajectories(limits=CallLimits(1.5, None))
    assert time.monotonic() - t0 < 20
    assert [t.env["task"] for t in out] == [fine.id]
    assert "cold start without 1 task(s)" in capsys.readouterr().err
