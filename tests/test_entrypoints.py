"""Smoke test of every entry point: each answers ``--help`` with exit 0 and a usage line.

    .venv/bin/python -m pytest -q tests/test_entrypoints.py

The entry points are discovered, so a new one cannot be forgotten: the console scripts of
pyproject's ``[project.scripts]`` (run as the installed script would call them), every
subcommand of their argparse parsers (walked recursively), ``python -m envace.cli`` (what
torchrun and accelerate launch), every ``bench/*.py`` (``python -m bench.X``) and every
``scripts/*.py``. Modules that are not command-line tools are excluded by name in
``NOT_TOOLS``, with the reason. A tool whose source builds no ``ArgumentParser`` fails without
being run: a ``--help`` it does not understand would start the real job (a benchmark rewrites
its ``bench/results`` file). Each ``--help`` runs in a fresh interpreter, as a user would run it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Python files under bench/ and scripts/ that are not command-line tools.
NOT_TOOLS = {
    "bench/__init__.py": "the package marker",
    "experiments/__init__.py": "the package marker",
    "bench/machine.py": "helpers: machine facts and the result writer every benchmark uses",
    "bench/provenance.py": "helpers: what a result file must record (checked by a test)",
}

# Subcommands that only say where they went (one line on stderr, exit 2 without --help).
# `envace-audit probe` moved to `envace probe`: its --help may show usage or that line.
MOVED = {("envace-audit", "probe"): "envace probe"}

HELP_TIMEOUT_S = 180  # heavy imports at module top take ~10 s on a loaded 2-core machine


def console_scripts() -> dict[str, str]:
    """``{name: "module:function"}`` from pyproject's ``[project.scripts]``."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def script_argv(name: str, target: str) -> list[str]:
    """The command line that does what the installed console script ``name`` does."""
    module, func = target.split(":")
    code = (f"import sys; sys.argv[0] = {name!r}; from {module} import {func} as f; "
            "sys.exit(f())")
    return [sys.executable, "-c", code]


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    """Every subcommand path of ``parser``, depth first (``("data", "export-real")``...)."""
    paths: list[tuple[str, ...]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths.append((name,))
                paths += [(name, *rest) for rest in subcommands(sub)]
    return paths


def script_parser(target: str) -> argparse.ArgumentParser | None:
    """The parser of a console script's module (its ``build_parser()``), if it exposes one."""
    module = importlib.import_module(target.split(":")[0])
    build = getattr(module, "build_parser", None)
    return build() if build is not None else None


def cli_cases() -> list[tuple[str, tuple[str, ...]]]:
    """``(console script, subcommand path)`` for every script and every subcommand."""
    cases = []
    for name, target in console_scripts().items():
        cases.append((name, ()))
        parser = script_parser(target)
        cases += [(name, path) for path in subcommands(parser)] if parser else []
    return cases


def tool_files() -> list[str]:
    """Every ``bench/*.py``, ``experiments/*.py`` and ``scripts/*.py`` that is a command-line
    tool."""
    files = sorted(str(p.relative_to(ROOT)) for d in ("bench", "experiments", "scripts")
                   for p in (ROOT / d).glob("*.py"))
    return [f for f in files if f not in NOT_TOOLS]


def tool_argv(path: str) -> list[str]:
    """``python -m bench.X`` / ``experiments.X`` for a benchmark or an experiment, ``python
    scripts/X.py`` for a script."""
    if path.startswith(("bench/", "experiments/")):
        return [sys.executable, "-m", path.split("/")[0] + "." + Path(path).stem]
    return [sys.executable, path]


def run_help(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), "OMP_NUM_THREADS": "1"}
    return subprocess.run([*argv, "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=HELP_TIMEOUT_S)


def assert_usage(r: subprocess.CompletedProcess, what: str) -> None:
    assert r.returncode == 0, f"{what} --help exited {r.returncode}:\n{r.stderr[-2000:]}"
    assert r.stdout.lstrip().startswith("usage: "), f"{what} --help printed no usage:\n{r.stdout}"


CLI_CASES = cli_cases()


@pytest.mark.parametrize(("script", "path"), CLI_CASES,
                         ids=[" ".join([s, *p]) for s, p in CLI_CASES])
def test_console_script_help(script: str, path: tuple[str, ...]) -> None:
    r = run_help([*script_argv(script, console_scripts()[script]), *path])
    what = " ".join([script, *path])
    moved_to = MOVED.get((script, *path))
    if moved_to and r.returncode != 0:  # the one line saying where it went
        assert r.returncode == 2 and moved_to in r.stderr, r.stderr
        return
    assert_usage(r, what)
    assert f"usage: {what}" in r.stdout  # the usage names the command as the user typed it
    if moved_to:
        assert moved_to in r.stdout


@pytest.mark.parametrize(("script", "path"), sorted(MOVED))
def test_moved_subcommand_says_where(script: str, path: str) -> None:
    """Used without --help, a moved subcommand says where it went and writes nothing."""
    argv = [*script_argv(script, console_scripts()[script]), path, "x.jsonl", "--out", "o"]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=HELP_TIMEOUT_S,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and MOVED[(script, path)] in r.stderr
    assert not (ROOT / "o").exists()


def test_module_entry_point_help() -> None:
    """``python -m envace.cli`` is what torchrun and accelerate launch."""
    r = run_help([sys.executable, "-m", "envace.cli"])
    assert_usage(r, "python -m envace.cli")


@pytest.mark.parametrize("path", tool_files())
def test_tool_help(path: str) -> None:
    source = (ROOT / path).read_text()
    assert "ArgumentParser" in source, (
        f"{path} has no argparse --help (running it would start the job): give it a parser, "
        "or list it in NOT_TOOLS with the reason")
    assert_usage(run_help(tool_argv(path)), path)


def test_discovery_finds_the_known_entry_points() -> None:
    """Discovery is not empty by accident: the commands the README documents are all found."""
    found = {" ".join([s, *p]) for s, p in CLI_CASES}
    assert {"envace", "envace-audit", "envace-dashboard", "envace data export-real",
            "envace data splits", "envace envs", "envace sft", "envace rollout", "envace train",
            "envace eval", "envace probe", "envace-audit replay", "envace-audit rescore",
            "envace-audit compare", "envace-audit baseline"} <= found
    tools = set(tool_files())
    assert {"scripts/gpu_check.py", "bench/audit_throughput.py", "scripts/make_splits.py"} <= tools
    assert not tools & set(NOT_TOOLS)
    assert all((ROOT / f).exists() for f in NOT_TOOLS), "NOT_TOOLS names a file that is gone"



def test_readme_command_table_names_every_subcommand() -> None:
    """The README's "What you can do" table lists every subcommand, and only real ones."""
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## What you can do"):readme.index("## How it works")]
    real = {(s, *p) for s, p in CLI_CASES}
    named: set[tuple[str, ...]] = set()
    for script in console_scripts():
        pattern = rf"`{re.escape(script)}(?![\w-])((?: [a-z][a-z-]*(?![\w=.-]))*)"
        for m in re.finditer(pattern, table):
            words, path = m.group(1).split(), (script,)
            while words and (*path, words[0]) in real:
                path += (words.pop(0),)
            leaf = not any(c[:len(path)] == path and len(c) > len(path) for c in real)
            assert leaf or not words, f"README: `{' '.join([*path, *words])}` is no subcommand"
            named |= {path[:k] for k in range(1, len(path) + 1)}
    missing = real - named - {(s, p) for s, p in MOVED}
    assert not missing, f"subcommands missing from the README's command table: {missing}"
