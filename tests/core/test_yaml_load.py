"""envace.core.yaml_load, and every command that reads a person's YAML through it (issue 39,
round 5: 2 KB of nested brackets crashed every YAML reader with a RecursionError traceback; a
model named twice in the board's models file silently kept the last)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from envace.core.yaml_load import MAX_DEPTH, YamlError, load_yaml

ROOT = Path(__file__).resolve().parents[2]
DEEP = "servers: " + "[" * 1000 + "]" * 1000 + "\n"  # the tester's deep.yaml (2 KB)


def test_plain_yaml_reads_as_safe_load_does():
    assert load_yaml("a: 1\nb: [x, {c: null}]\n") == {"a": 1, "b": ["x", {"c": None}]}
    assert load_yaml("") is None
    # a merge key may be overridden: that is no duplicate
    assert load_yaml("b: &x {a: 1}\nc: {<<: *x, a: 2}\n") == {"b": {"a": 1}, "c": {"a": 2}}


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 50_000])
def test_deep_nesting_is_one_clear_error_naming_the_file(depth):
    with pytest.raises(YamlError, match=r"^deep\.yaml: nested more than 100 levels"):
        load_yaml("servers: " + "[" * depth + "]" * depth, "deep.yaml")
    assert load_yaml("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)) is not None


@pytest.mark.parametrize("text, lines", [
    ("models:\n  a: {reference: lookup}\n  a: {reference: edit}\n", "lines 2 and 3"),
    ("{a: 1, a: 2}", "lines 1 and 1"),
    ("x: 1\ny:\n  z: 2\nx: 3\n", "lines 1 and 4"),
])
def test_a_key_given_twice_is_refused_naming_the_key_and_its_lines(text, lines):
    with pytest.raises(YamlError, match=f"f.yaml: the key '.' is given twice \\({lines}\\)"):
        load_yaml(text, "f.yaml")


def test_not_yaml_is_one_line_with_its_place():
    with pytest.raises(YamlError, match=r"^f: not YAML: .*\(line 1, column 6\)$"):
        load_yaml("a: [1", "f")


def _run(tmp: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k in ("ENVACE_MCP_CONFIG", "ENVACE_MCP_TASKS"):
        env.pop(k, None)
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                          cwd=tmp, env=env, timeout=120)


@pytest.mark.parametrize("argv", [
    ["envace.cli.main", "envs", "--mcp-config", "deep.yaml"],
    ["audit.cli", "--quiet", "replay", "x.jsonl", "--mcp-config", "deep.yaml", "--out", "a"],
    ["envace.cli.main", "train", "--config", "deep.yaml"],
    ["envace.cli.main", "board", "--quiet", "--models", "deep.yaml", "--envs", "bfcl",
     "--out", "b"],
], ids=["envs", "replay", "train", "board"])
def test_every_command_reading_yaml_refuses_deep_nesting_with_exit_2(tmp_path, argv):
    (tmp_path / "deep.yaml").write_text(DEEP)
    (tmp_path / "x.jsonl").write_text("")
    r = _run(tmp_path, *argv)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "RecursionError" not in r.stderr, r.stderr[-2000:]
    assert "deep.yaml" in r.stderr and "nested more than" in r.stderr, r.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_training_config_refuses_a_key_given_twice(tmp_path):
    from envace.training.config import ConfigError, TrainConfig
    from envace.training.config_base import load_config

    (tmp_path / "c.yaml").write_text("lr: 1.0e-6\nlr: 2.0e-6\n")
    with pytest.raises(ConfigError, match="'lr' is given twice"):
        load_config(TrainConfig, tmp_path / "c.yaml", [])
