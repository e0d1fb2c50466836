"""`envace train` with a model it cannot start from (tester C13: run from another directory, the
default config's relative model path named nothing; the command died with a traceback after
creating the run directory, which held a stale RUNNING): one line, exit 2, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_model_that_is_not_there_is_refused_before_the_run_exists(tmp_path):
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", "from envace.cli.main import main; "
                        "raise SystemExit(main())", "train", "steps=1", f"output_dir={out}"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, r.stderr
    assert "neither a preset" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()
