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


def test_eval_never_writes_into_another_tools_folder(tmp_path):
    """Tester E17: `envace eval --out` over an audit's folder truncated its trajectories.jsonl.
    Another tool's folder is refused (exit 2) before the model loads and left as it was; an
    earlier evaluation's folder, or a new one, is accepted."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    from envace.core.errors import UsageError
    from envace.evaluation.evaluate import check_eval_out

    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "trajectories.jsonl").write_text('{"x": 1}\n')
    (audit / "steps.jsonl").write_text("{}\n")
    (audit / "summary.json").write_text(json.dumps({"schema": "envace.audit/2"}))
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", "from envace.cli.main import main; "
                        "raise SystemExit(main())", "eval", "--model", "data/models/tiny-sft",
                        "--split", "dev", "--out", str(audit)],
                       capture_output=True, text=True, cwd=root, timeout=120)
    assert r.returncode == 2 and "not an evaluation's" in r.stderr, r.stderr
    assert (audit / "trajectories.jsonl").read_text() == '{"x": 1}\n'
    only_audit_summary = tmp_path / "a2"
    only_audit_summary.mkdir()
    (only_audit_summary / "summary.json").write_text(json.dumps({"schema": "envace.audit/2"}))
    with pytest.raises(UsageError):
        check_eval_out(only_audit_summary)
    earlier = tmp_path / "eval"
    earlier.mkdir()
    (earlier / "summary.json").write_text(json.dumps({"success_rate": 0.5}))
    (earlier / "trajectories.jsonl").write_text("")
    check_eval_out(earlier)
    check_eval_out(tmp_path / "new")
