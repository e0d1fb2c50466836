"""A stored step row cannot claim a depth or index no trajectory can have (the hostile tester:
``depth: 10**6`` in steps.jsonl stalled rescore building a million-row survival table)."""

from __future__ import annotations

import pytest

from audit.store.step_rows import step_problem

ROW = {"trajectory_id": "t", "task_id": "x", "step": 3, "tool": "ls", "actual": "{}",
       "diverged": False, "scores": {"exact": 1.0}}


@pytest.mark.parametrize("change, bad", [
    ({"depth": 3}, False), ({"depth": 0}, False), ({}, False),
    ({"depth": 4}, True), ({"depth": 10**6}, True), ({"step": 10**30, "depth": 10**30}, True),
    ({"step": -1}, True), ({"depth": -1}, True),
])
def test_depth_and_step_bounds(change, bad):
    problem = step_problem({**ROW, **change})
    assert (problem is not None) == bad, problem
