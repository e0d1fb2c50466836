"""Numbers on envace's command lines (issue 39, tester round 5 cases 17-19): a bad value is a
usage error (exit 2, one line, before any model loads), never a traceback from deep inside
(`eval --tasks=-1`: "Sample larger than population") or a silent nonsense run (`rollout
--temperature=-1`, `--top-p=5`, `probe --max-new-tokens=0`: "divergence 100 %")."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envace.cli.argtypes import MAX_COUNT, count, number

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "data" / "models" / "tiny-sft")


@given(st.integers(min_value=-10, max_value=10), st.integers(min_value=-(2**40), max_value=2**40))
def test_count_takes_exactly_the_whole_numbers_in_range(minimum, value):
    parse = count(minimum)
    if minimum <= value <= MAX_COUNT:
        assert parse(str(value)) == value
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(str(value))


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_number_takes_exactly_the_finite_values_in_range(value):
    parse = number(0, 1, low_open=True)
    if math.isfinite(value) and 0 < value <= 1:
        assert parse(repr(value)) == value
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(repr(value))


@pytest.mark.parametrize("text", ["", "x", "1.5", "nan", "1e3"])
def test_count_refuses_what_is_not_a_whole_number(text):
    with pytest.raises(argparse.ArgumentTypeError):
        count(0)(text)


def _envace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envace.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("args", [
    ("eval", "--model", TINY, "--tasks=-1"),
    ("eval", "--model", TINY, "--seeds=0"),
    ("eval", "--model", TINY, "--max-context=-5"),
    ("eval", "--model", TINY, "--max-new-tokens=0"),
    ("rollout", "--model", TINY, "--out", "OUT", "--temperature=nan"),
    ("rollout", "--model", TINY, "--out", "OUT", "--temperature=-1"),
    ("rollout", "--model", TINY, "--out", "OUT", "--top-p=5"),
    ("rollout", "--model", TINY, "--out", "OUT", "--max-turns=-1"),
    ("rollout", "--model", TINY, "--out", "OUT", "--tasks=-3"),
    ("probe", "--model", TINY, "IN", "--out", "OUT", "--max-new-tokens=0"),
    ("probe", "--model", TINY, "IN", "--out", "OUT", "--confidence", "--max-new-tokens=-3"),
    ("probe", "--likelihood", "--model", TINY, "IN", "--out", "OUT", "--context=0"),
])
def test_a_bad_number_is_a_usage_error_and_nothing_is_written(tmp_path, args):
    args = tuple(str(tmp_path / a) if a in ("IN", "OUT") else a for a in args)
    r = _envace(*args)
    assert r.returncode == 2, (args, r.returncode, r.stderr[-500:])
    assert "Traceback" not in r.stderr and "give a" in r.stderr
    assert not (tmp_path / "OUT").exists()


def test_a_context_past_the_models_positions_is_refused(tmp_path):
    """Before: --context 1000000 scored 36,979 tokens in one pass past the model's 4,096
    positions and reported a figure, exit 0."""
    src = tmp_path / "in.jsonl"
    src.write_text("")
    r = _envace("probe", "--likelihood", "--model", TINY, str(src), "--out",
                str(tmp_path / "o"), "--context", "1000000")
    assert r.returncode == 2 and "passes the model's 4096 positions" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()
