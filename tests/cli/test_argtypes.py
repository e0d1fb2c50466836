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
    ("probe", "--model", TINY, "IN", "--out", "OUT", "--threshold=nan"),
    ("probe", "--model", TINY, "IN", "--out", "OUT", "--threshold=5"),
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


def test_a_context_past_n_positions_is_refused_and_a_broken_model_is_one_line(tmp_path):
    """Round 6: a config that says its positions as n_positions (GPT-2 style) or as 2048.0 was
    not checked, and a folder without weights gave a 35-line traceback."""
    import json

    from envace.model.models import position_limit

    for i, cfg in enumerate(({"n_positions": 1024}, {"max_position_embeddings": 2048.0},
                             {"max_position_embeddings": "2048"})):
        d = tmp_path / f"m{i}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": "llama", **cfg}))
        assert position_limit(d) == (1024, 2048, None)[i]
    src = tmp_path / "in.jsonl"
    src.write_text("")
    r = _envace("probe", "--likelihood", "--model", str(tmp_path / "m0"), str(src), "--out",
                str(tmp_path / "o"), "--context", "5000")
    assert r.returncode == 2 and "passes the model's 1024 positions" in r.stderr, r.stderr
    r = _envace("probe", "--likelihood", "--model", str(tmp_path / "m2"), str(src), "--out",
                str(tmp_path / "o"))
    assert r.returncode == 2 and "cannot load the model" in r.stderr, r.stderr[-800:]
    assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()


@pytest.mark.parametrize("args", [
    ("envs", "--mcp-config", "FIFO"),
    ("train", "--config", "FIFO"),
])
def test_a_config_that_is_a_fifo_is_refused_not_waited_on(tmp_path, args):
    """Round 6: `envace envs --mcp-config FIFO` and `envace train --config FIFO` hung (and a
    link to /dev/zero filled memory): a config is read only as a regular file of <= 16 MiB."""
    import os

    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    args = tuple(str(fifo) if a == "FIFO" else a for a in args)
    if args[0] == "train":
        args = (*args, f"output_dir={tmp_path / 'runs'}")
    r = _envace(*args)
    assert r.returncode in (2, 3), r.stderr[-800:]
    assert "not a regular file" in (r.stderr + r.stdout) and "Traceback" not in r.stderr
