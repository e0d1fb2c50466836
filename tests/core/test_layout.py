"""The file names of run and audit directories: `envace.core.layout` and the contract agree.

docs/spec/run_dir.md (the run directory's tree) and docs/spec/trajectory.md ("Audit output")
name the files; `RUN` and `AUDIT` define them for the code. These tests fail when one side
gains, loses or renames a file the other does not, and when project code spells a file name as
a literal again instead of going through the layout.
"""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from envace.core.layout import AUDIT, RUN

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "docs" / "spec"
CODE = ("envace", "audit", "dashboard", "bench", "experiments", "scripts")
# names that are also words of the code (a run's kind, a command, a JSON key): not checked as
# literals
WORDS = {RUN.audit, RUN.eval, RUN.rollouts, RUN.checkpoints, RUN.initial_model,
         RUN.initial_world_model}


def _names(layout: Any) -> set[str]:
    return {getattr(layout, f.name) for f in fields(layout)}


def _run_dir_tree() -> set[str]:
    """The names of the tree in run_dir.md: the first column of each entry, per path part."""
    text = (SPEC / "run_dir.md").read_text(encoding="utf-8")
    block = text.split("```", 2)[1]
    lines = block.splitlines()
    root = next(i for i, x in enumerate(lines) if x.startswith("runs/<name>/"))
    names = set()
    for line in lines[root + 1:]:
        m = re.match(r"( {2}| {4})(\S+)", line)  # an entry; a description goes on deeper
        if m:
            names.update(p for p in m.group(2).split("/") if p and "<" not in p)
    return names


def _audit_section() -> set[str]:
    """The file names the "Audit output" section of trajectory.md gives in backticks."""
    text = (SPEC / "trajectory.md").read_text(encoding="utf-8")
    section = text.split("## Audit output", 1)[1].split("\n## ", 1)[0]
    quoted = re.findall(r"`([^`]+)`", section)
    return {m for q in quoted for m in re.findall(r"[\w.]+\.(?:jsonl|json|md|png)\b", q)}


def test_run_layout_names_exactly_the_files_of_run_dir_md():
    tree = _run_dir_tree()
    assert {"config.yaml", "metrics.jsonl", "RUNNING", "trainer_state.json"} <= tree  # parsed
    assert _names(RUN) == tree, (sorted(_names(RUN) - tree), sorted(tree - _names(RUN)))
    assert RUN.files == _names(RUN)


def test_audit_layout_names_exactly_the_files_of_the_audit_output_spec():
    spec = _audit_section()
    assert {"steps.jsonl", "summary.json", "report.md"} <= spec  # parsed
    assert _names(AUDIT) == spec, (sorted(_names(AUDIT) - spec), sorted(spec - _names(AUDIT)))
    assert AUDIT.files <= spec and set(AUDIT.plots) <= AUDIT.files


def test_paths_follow_the_spec(tmp_path):
    assert RUN.rollout_file(tmp_path, 3) == tmp_path / "rollouts" / "step_3.jsonl"
    assert RUN.step_audit(tmp_path, 3) == tmp_path / "audit" / "step_3"
    assert RUN.checkpoint_dir(tmp_path, 3) == tmp_path / "checkpoints" / "step_3"
    assert RUN.eval_dir(tmp_path, "dev") == tmp_path / "eval" / "dev"
    assert set(RUN.markers) <= RUN.files and set(AUDIT.markers) <= AUDIT.files


def _literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_project_code_spells_no_file_name_but_through_the_layout():
    names = (_names(RUN) | _names(AUDIT)) - WORDS
    layout = ROOT / "envace" / "core" / "layout.py"
    found = [f"{p.relative_to(ROOT)}:{line}: {value!r}"
             for top in CODE for p in sorted((ROOT / top).rglob("*.py")) if p != layout
             for line, value in _literals(p) if value in names]
    assert found == []
