"""Numbers on the command line that the hostile tester got through: a non-finite call limit
(every record skipped, or a traceback) and an --alpha outside (0, 1) ('significant' at p = 1)."""

from __future__ import annotations

import argparse

import pytest

from audit.cli import _alpha
from envace.core.envs.limits import limit_arg


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-1", "abc", "", "9223372036854",
                                  "16777217", "1e300"])
def test_a_call_limit_must_be_finite_and_not_negative(text):
    with pytest.raises(argparse.ArgumentTypeError):
        limit_arg(text)


def test_a_call_limit_known_answers():
    assert limit_arg("0") == 0.0 and limit_arg("2.5") == 2.5 and limit_arg("4096") == 4096.0
    assert limit_arg("16777216") == 2**24


def test_a_huge_memory_limit_is_a_usage_error_not_every_record_skipped(tmp_path):
    """Tester round 5, case 16: --call-memory-mb 9223372036854 skipped every record (the
    child could not set its address space) or gave a traceback; now exit 2, nothing written."""
    import subprocess
    import sys

    src = tmp_path / "in.jsonl"
    src.write_text("")
    r = subprocess.run([sys.executable, "-m", "audit.cli", "replay", str(src), "--out",
                        str(tmp_path / "o"), "--call-memory-mb", "9223372036854"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "at most 16777216" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_workers_are_bounded(tmp_path):
    """Tester round 5, case 5: --workers 100000 started thousands of processes."""
    import subprocess
    import sys

    src = tmp_path / "in.jsonl"
    src.write_text("")
    for n in ("0", "257", "100000"):
        r = subprocess.run([sys.executable, "-m", "audit.cli", "replay", str(src), "--out",
                            str(tmp_path / "o"), "--workers", n], capture_output=True, text=True)
        assert r.returncode == 2 and "between 1 and 256" in r.stderr, (n, r.stderr)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("text", ["0", "1", "2", "nan", "-0.1", "x"])
def test_alpha_is_strictly_between_0_and_1(text):
    with pytest.raises(argparse.ArgumentTypeError):
        _alpha(text)


def test_alpha_known_answers():
    assert _alpha("0.05") == 0.05 and _alpha("0.999") == 0.999


@pytest.mark.parametrize("unit", ["diverged", "scores", "messages", "__class__", "TRAJECTORY",
                                  "Scenario", "", "../x"])
def test_cluster_by_refuses_outcomes_dunders_and_misspelt_units(unit):
    from audit.stats.clusters import check_unit

    assert check_unit(unit)


@pytest.mark.parametrize("unit", ["trajectory", "task", "scenario", "suite", "group_id"])
def test_cluster_by_accepts_units_and_grouping_fields(unit):
    from audit.stats.clusters import check_unit

    assert check_unit(unit) is None
