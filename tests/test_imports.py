"""Import hygiene: the audit and the core never import torch."""

from __future__ import annotations

import subprocess
import sys

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
