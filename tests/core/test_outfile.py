"""Output files written safely (envace.core.outfile): what the hostile tester broke in
`envace data record` (a device node replaced, as root) and `export-real` (writes through a
link, onto a FIFO or a directory, a partial file on a full disk)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from envace.core.errors import UsageError
from envace.core.outfile import atomic_output, check_output_file

ROOT = Path(__file__).resolve().parents[2]


def test_refuses_links_special_files_directories_and_inputs(tmp_path):
    target = tmp_path / "t.jsonl"
    target.write_text("keep\n")
    link = tmp_path / "l.jsonl"
    link.symlink_to(target)
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    for bad in (link, fifo, tmp_path, Path("/dev/null")):
        with pytest.raises(UsageError):
            check_output_file(bad)
    with pytest.raises(UsageError, match="input"):
        check_output_file(target, inputs=[target])
    assert target.read_text() == "keep\n" and Path("/dev/null").is_char_device()
    assert check_output_file(tmp_path / "new.jsonl") == tmp_path / "new.jsonl"


def test_atomic_output_is_whole_or_absent(tmp_path):
    out = tmp_path / "o.jsonl"
    with pytest.raises(RuntimeError), atomic_output(out) as tmp:
        tmp.write_text("half")
        raise RuntimeError("the disk filled up")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    with atomic_output(out) as tmp:
        tmp.write_text("whole\n")
    assert out.read_text() == "whole\n" and [p.name for p in tmp_path.iterdir()] == ["o.jsonl"]


@pytest.mark.parametrize("kind", ["fifo", "link", "dir"])
def test_export_real_refuses_an_unsafe_out_with_exit_2(tmp_path, kind):
    target = tmp_path / "t.jsonl"
    target.write_text("keep\n")
    out = tmp_path / "out"
    if kind == "fifo":
        os.mkfifo(out)
    elif kind == "link":
        out.symlink_to(target)
    else:
        out.mkdir()
    r = subprocess.run([sys.executable, "-m", "envace.cli", "data", "export-real", "--tasks",
                        "multi_turn_base_0", "--out", str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-500:]
    assert "nothing written" in r.stderr and "Traceback" not in r.stderr
    assert target.read_text() == "keep\n"


def test_an_atomic_output_gets_the_umasks_mode_not_mkstemps(tmp_path):
    """Tester round 5, case 20: export-real and data record outputs were 0600 under umask 022."""
    import os

    from envace.core.outfile import atomic_output, created_mode

    old = os.umask(0o022)
    try:
        assert created_mode() == 0o644
        with atomic_output(tmp_path / "out.jsonl") as tmp:
            tmp.write_text("x\n")
        assert (tmp_path / "out.jsonl").stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)


def test_an_input_that_is_not_a_regular_file_is_named_for_what_it_is(tmp_path):
    """Tester round 5, case 20: a FIFO input was "no such file"; a FIFO is never opened."""
    import os

    from envace.core.outfile import input_problem

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "f").write_text("x")
    assert input_problem(fifo) == f"{fifo} is a FIFO, not a regular file"
    assert input_problem(tmp_path) == f"{tmp_path} is a directory, not a regular file"
    assert input_problem(tmp_path / "nope") == f"no such file: {tmp_path / 'nope'}"
    assert input_problem(tmp_path / "f") is None
