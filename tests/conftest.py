"""Shared test fixtures: the project root and the spec's example files.

The examples of ``docs/spec/trajectory.md`` live in ``tests/data/spec_examples`` (the project's
own copy), so a fresh clone runs every test that reads them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "docs" / "spec"
EXAMPLES = ROOT / "tests" / "data" / "spec_examples"


@pytest.fixture(scope="session")
def examples() -> Path:
    assert EXAMPLES.exists(), f"spec examples missing at {EXAMPLES}"
    return EXAMPLES
