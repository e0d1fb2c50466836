"""Reading a small input file (a config, a models file, a summary) without hanging or filling
memory: only a regular file is read (a FIFO, a device, a directory is refused before any read
can block), and at most ``max_bytes`` of it.

    text = read_small_text("models.yaml", 16 << 20, "--models")   # UsageError when refused
"""

from __future__ import annotations

import os
import stat

from envace.core.errors import UsageError

#: the default cap of a small input file (a models file, a config): 16 MiB
MAX_SMALL_BYTES = 16 * 1024 * 1024


def read_small_bytes(path: str | os.PathLike[str], max_bytes: int = MAX_SMALL_BYTES,
                     what: str = "the file") -> bytes:
    """The bytes of regular file ``path``; UsageError naming ``what`` when it cannot be read,
    is not a regular file, or is longer than ``max_bytes``. Opened non-blocking, so a FIFO
    nobody writes is refused rather than waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{what} {path} is not a regular file")
        if info.st_size > max_bytes:
            raise UsageError(f"{what} {path} is {info.st_size} bytes, past the limit of "
                             f"{max_bytes}")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:  # grew while read
                raise UsageError(f"{what} {path} is past the limit of {max_bytes} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_small_text(path: str | os.PathLike[str], max_bytes: int = MAX_SMALL_BYTES,
                    what: str = "the file") -> str:
    """:func:`read_small_bytes` decoded as UTF-8 (UsageError when it is not)."""
    data = read_small_bytes(path, max_bytes, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} {path} is not UTF-8 text (byte {exc.start})") from None
