"""Shared test fixtures: paths to the shared spec examples and the project root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = Path(os.environ.get("ENVACE_SPEC", ROOT.parent / "shared" / "spec"))
EXAMPLES = SPEC / "examples"


@pytest.fixture(scope="session")
def examples() -> Path:
    if not EXAMPLES.exists():
        pytest.skip(f"shared spec examples not found at {EXAMPLES}")
    return EXAMPLES
