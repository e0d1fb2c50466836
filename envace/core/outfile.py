"""One output file written safely: never through a link, never onto a device, a FIFO or a
directory, never over an input, and whole or not at all (a temporary file renamed into place).

    check_output_file("dev.jsonl", inputs=["tasks.jsonl"])   # UsageError when refused
    with atomic_output("dev.jsonl") as tmp:                  # write tmp; renamed on success
        ...

Used by the commands that write one trajectory file (``envace data export-real``, ``envace
data record``) and by ``envace board`` for each of its files (``write_text``: any text, a lone
surrogate written as its escape); audit directories have their own writer
(``audit.store.output``).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from envace.core.errors import UsageError


def check_output_file(out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]] = ()
                      ) -> Path:
    """The output path, or UsageError: it is a symbolic link, exists and is not a regular file
    (a device such as /dev/full, a FIFO, a directory), or is one of ``inputs``."""
    path = Path(out)
    if path.is_symlink():
        raise UsageError(f"{path} is a symbolic link: refusing to write through it")
    if path.exists():
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise UsageError(f"{path} exists and is not a regular file: refusing to write it")
        for i in inputs:
            if Path(i).exists() and os.path.samefile(path, i):
                raise UsageError(f"{path} is an input of this command: refusing to write it")
    return path


@contextlib.contextmanager
def atomic_output(out: str | os.PathLike[str],
                  inputs: Iterable[str | os.PathLike[str]] = ()) -> Iterator[Path]:
    """A temporary file beside ``out`` to write; renamed onto ``out`` when the block ends
    without an exception, removed otherwise (a full disk leaves nothing behind)."""
    path = check_output_file(out, inputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, created_mode())  # mkstemp makes 0600; a written file gets the umask's mode
    try:
        yield Path(tmp)
        check_output_file(path, inputs)  # nothing took its place while it was written
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def created_mode() -> int:
    """The mode a file created by ``open(path, "w")`` would get here (0666 less the umask):
    what an atomically written output file is given (``mkstemp`` makes every file 0600). The
    umask is read from ``/proc/self/status`` where there is one: setting it to read it back
    would change it for a moment under every other thread of the process."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def input_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be read as an input file (one phrase), or None: it does not exist,
    is not a regular file (a FIFO, a directory, a device: never opened, so never waited on), or
    cannot be read."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        return f"no such file: {path}"
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    if not stat.S_ISREG(mode):
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a device or socket")
        return f"{path} is {kind}, not a regular file"
    if not os.access(p, os.R_OK):
        return f"cannot read {path}: permission denied"
    return None


def write_text(out: str | os.PathLike[str], text: str,
               inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """Write ``text`` to ``out`` through :func:`atomic_output` (never through a link, whole or
    not at all) as UTF-8; a lone surrogate (``"\\ud800"`` decoded from JSON, a non-UTF-8 file
    name) is written as its ``\\ud800`` escape instead of failing the write."""
    path = Path(out)
    with atomic_output(path, inputs) as tmp:
        tmp.write_text(text, encoding="utf-8", errors="backslashreplace")
    return path
