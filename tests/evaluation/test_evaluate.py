"""Evaluation's success interval: several seeds of one task are not independent attempts."""

from __future__ import annotations

from audit.stats.intervals import wilson_ci
from envace.evaluation.evaluate import success_interval


def test_one_attempt_per_task_is_wilson():
    per_task = {f"t{i}": [i < 3] for i in range(20)}
    ci, method = success_interval(per_task)
    assert method == "wilson" and ci == list(wilson_ci(3, 20))


def test_repeated_seeds_of_one_task_do_not_narrow_the_interval():
    """10 tasks, 4 seeds each, a task succeeds on every seed or on none: 40 attempts carry the
    information of 10. The interval resamples tasks, so it is as wide as Wilson's on 10 tasks,
    not the one on 40 attempts."""
    per_task = {f"t{i}": [i < 3] * 4 for i in range(10)}
    ci, method = success_interval(per_task)
    assert method.startswith("task_bootstrap")
    naive = wilson_ci(12, 40)
    by_task = wilson_ci(3, 10)
    assert ci[1] - ci[0] > (naive[1] - naive[0]) * 1.3
    assert ci[0] <= by_task[0] + 1e-3 and ci[1] >= by_task[1] - 1e-3
