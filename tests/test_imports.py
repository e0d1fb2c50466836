"""Import hygiene: the audit and the core never import torch; every function-level import of
the project's own modules says why it is not at module level."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("module", [
    "audit", "envace", "envace.core.schema", "envace.core.envs.bfcl.env",
    "envace.core.envs.bfcl.verify", "envace.core.export", "envace.cli"])
def test_light_modules_do_not_import_torch(module):
    code = (f"import sys, {module}; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, f"{module} imports {r.stdout.strip()} {r.stderr[-500:]}"


# ---------------------------------------------------------------- lazy imports, each explained

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("envace", "audit", "dashboard")
LAZY = "# lazy:"


def unexplained_lazy_imports(source: str) -> list[int]:
    """Lines of imports of the project's own modules made inside a function without a
    ``# lazy: <reason>`` comment (on the import's line, or on the line above the block of
    imports it stands in). Module-level imports say who depends on whom; a lazy one must say
    why it cannot be one (a heavy dependency kept out of ``--help``, a layer rule, ...)."""
    tree, lines = ast.parse(source), source.splitlines()
    found = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if not any(n.split(".")[0] in PROJECT for n in names):
                continue
            if LAZY in lines[node.lineno - 1]:
                continue
            above = node.lineno - 2
            while above >= 0 and _in_import_block(lines[above]):
                above -= 1
            if above < 0 or not lines[above].strip().startswith(LAZY):
                found.add(node.lineno)
    return sorted(found)


def _in_import_block(line: str) -> bool:
    s = line.strip()
    return s.startswith(("from ", "import ")) or s.endswith((",", "(")) or s == ")"


def test_the_rule_finds_an_unexplained_lazy_import():
    bad = "def f():\n    from audit.cli import main\n    return main\n"
    good = ("def f():\n    # lazy: loads numpy: kept out of --help\n"
            "    from audit.cli import main\n    from envace.core.text import terminal_safe\n"
            "    return main\n")
    assert unexplained_lazy_imports(bad) == [2]
    assert unexplained_lazy_imports(good) == []
    assert unexplained_lazy_imports("import json\ndef f():\n    import json\n") == []


def test_every_lazy_import_of_the_project_says_why():
    missing = {str(p.relative_to(ROOT)): lines
               for pkg in PROJECT for p in sorted((ROOT / pkg).rglob("*.py"))
               if (lines := unexplained_lazy_imports(p.read_text()))}
    assert not missing, (
        f"function-level imports of the project's modules without a '{LAZY} <reason>' comment: "
        f"{missing}; import at module level unless a heavy dependency or a layer rule needs "
        "laziness, and then say which")
