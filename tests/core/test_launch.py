"""envace.core.launch: a stop while a command is still importing ends like a later one (one
line, 128 + the signal), and the console scripts go through it. Real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SLOW = '''
import os, sys, time
open(os.environ["READY"], "w").close()   # the import has begun
time.sleep(float(os.environ.get("SLEEP", "30")))

def main():
    print("ran", flush=True)
    return int(os.environ.get("CODE", "0"))
'''


def _default_stops() -> None:
    """In the child: the stop signals as a terminal's shell leaves them."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


def _launch(tmp_path: Path, atomic: bool = True, **env: str) -> subprocess.Popen:
    (tmp_path / "slow_cmd.py").write_text(SLOW)
    code = ("import sys; from envace.core.launch import launch; "
            f"sys.exit(launch('prog', 'slow_cmd', atomic={atomic}))")
    return subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_default_stops,
                            env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
                                 "READY": str(tmp_path / "ready"), **env})


def _wait_ready(tmp_path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the command never began its import"
        time.sleep(0.02)


@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "SIGTERM"),
                                                   (signal.SIGHUP, 129, "SIGHUP")])
def test_a_stop_during_the_import_ends_with_one_line_and_its_code(tmp_path, sig, code, word):
    proc = _launch(tmp_path)
    _wait_ready(tmp_path, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prog: ") and word in lines[0], err
    assert "nothing written" in lines[0]


def test_a_command_that_is_not_atomic_does_not_claim_so(tmp_path):
    proc = _launch(tmp_path, atomic=False)
    _wait_ready(tmp_path, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "prog: interrupted"


@pytest.mark.parametrize("code", [0, 3])
def test_without_a_stop_the_command_runs_and_its_code_is_the_exit(tmp_path, code):
    proc = _launch(tmp_path, SLEEP="0", CODE=str(code))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code and out == "ran\n" and err == ""


@pytest.mark.parametrize(("script", "module", "heavy"), [("envace-audit", "audit.entry",
                                                          "audit.cli"),
                                                         ("envace", "envace.entry", "envace.cli")])
def test_the_console_scripts_import_their_command_only_under_launch(script, module, heavy):
    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == script]
    assert ep.value == f"{module}:main"
    probe = (f"import sys, {module}; "
             f"print(sorted(m for m in sys.modules if m.startswith(('audit', 'envace'))))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True, cwd=ROOT).stdout
    assert heavy not in loaded and "envace.core.interrupts" not in loaded, loaded
