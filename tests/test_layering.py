"""The layering rule of the house, checked two ways.

- `envace.core` imports neither torch nor any other part of envace (nor audit, nor dashboard);
- `audit` imports only `envace.core` of envace (and never the dashboard);
- `dashboard` imports only `envace.core` and `audit`;
- the runtime (`envace.model`, `envace.training`, `envace.evaluation`, `envace.cli`) may import
  all three, and has floors of its own: `model` at the bottom, `evaluation` above it, `training`
  above that (it runs the final evaluation), `cli` on top; no floor imports a higher one (type-only
  imports under ``TYPE_CHECKING`` included: they are dependencies too).

Statically, every import statement of every module (lazy ones inside functions too) is read
with `ast`; at run time, every module of the three torch-free packages is imported in a fresh
interpreter and what got loaded is checked. Streamlit page scripts (`dashboard/views/*`,
`dashboard/app.py`) run their page when imported, so they are checked statically only.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "vllm", "trl", "accelerate")
RUNTIME = ("envace.model", "envace.training", "envace.evaluation", "envace.cli")
# layer -> prefixes its modules must never import (statically or at run time)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "envace.core": (*HEAVY, *RUNTIME, "audit", "dashboard"),
    "audit": (*HEAVY, *RUNTIME, "dashboard"),
    "dashboard": (*HEAVY, *RUNTIME),
}
PAGE_SCRIPTS = ("dashboard/views/", "dashboard/app.py")
# the runtime's floors, bottom first: a module may import its own floor and those below
FLOORS = ("envace.model", "envace.evaluation", "envace.training", "envace.cli")


def _files(layer: str) -> list[Path]:
    return sorted((ROOT / layer.replace(".", "/")).rglob("*.py"))


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path, module: str | None = None) -> set[str]:
    """Every module an import statement of `path` names (absolute; relative ones resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    here = (module or _module(path)).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*here[: len(here) - node.level + 1], *filter(None, [base])])
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def _hits(names: set[str] | list[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == b or n.startswith(b + ".") for b in banned))


def test_every_layer_has_modules():
    for layer in FORBIDDEN:
        assert len(_files(layer)) >= 3, layer


@pytest.mark.parametrize("layer", list(FORBIDDEN))
def test_imports_respect_the_layers_statically(layer):
    bad = {}
    for path in _files(layer):
        hits = _hits(_imports(path), FORBIDDEN[layer])
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    assert not bad, f"{layer} must not import {FORBIDDEN[layer]}: {bad}"


@pytest.mark.parametrize("layer", list(FORBIDDEN))
def test_imports_respect_the_layers_at_run_time(layer):
    mods = [_module(p) for p in _files(layer)
            if not str(p.relative_to(ROOT)).startswith(PAGE_SCRIPTS)]
    code = (
        "import importlib, json, sys\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    loaded = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(mods) <= set(loaded)
    assert not _hits(loaded, FORBIDDEN[layer]), f"{layer} loaded {_hits(loaded, FORBIDDEN[layer])}"


def test_the_checker_sees_a_lazy_import(tmp_path):
    """The static check reads imports inside functions and resolves relative ones."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from ..training import train\n    import torch\n")
    names = _imports(probe, "envace.core.probe")
    assert _hits(names, FORBIDDEN["envace.core"]) == ["envace.training", "envace.training.train",
                                                      "torch"]


def _floor(name: str) -> int | None:
    return next((i for i, f in enumerate(FLOORS) if name == f or name.startswith(f + ".")), None)


@pytest.mark.parametrize("floor", FLOORS[:-1])
def test_no_runtime_floor_imports_a_higher_one(floor):
    here = FLOORS.index(floor)
    bad = {}
    for path in _files(floor):
        up = sorted(n for n in _imports(path) if (_floor(n) or 0) > here)
        if up:
            bad[str(path.relative_to(ROOT))] = up
    assert not bad, f"{floor} must not import {FLOORS[here + 1:]}: {bad}"


def test_the_floor_checker_sees_an_upward_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from envace.training.config import TrainConfig\n")
    names = _imports(probe, "envace.model.probe")
    assert sorted(n for n in names if (_floor(n) or 0) > 0) == ["envace.training.config",
                                                          "envace.training.config.TrainConfig"]
