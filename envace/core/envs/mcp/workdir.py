"""A trajectory's working directory: the task's state files written in, the state read back.

The state of an MCP environment is the files of its workdir (the server's working directory):
``{"files": {relative posix path: text}}``, a file that is not UTF-8 text (or over
:data:`MAX_TEXT_BYTES`) as ``{"sha256": ..., "bytes": n}``, a symlink as ``{"symlink": target}``
(never followed: a link to ``/dev/zero`` or out of the workdir is its target's text), a FIFO,
socket or device as ``{"kind": "fifo"}`` (never opened: reading a FIFO blocks for ever).

Reading is bounded in memory and time, whatever the server leaves there (issue 39): only regular
files are opened, a long file is hashed in 1 MiB chunks, and past :data:`MAX_HASHED_BYTES` only its
first and last 8 MiB are hashed (``"hashed_bytes"`` says so; a 1 GiB sparse file costs 16 MiB of
reading, not 1 GiB of memory); past :data:`MAX_STATE_HASHED_BYTES` in one reading, a long file is
its size only; past :data:`MAX_STATE_ENTRIES` entries the walk stops and the state says so
(``"truncated"``). A bounded hash rather than the modification time: the state must be the same
in two runs of the same calls (the verifier and the replay compare states across workdirs, where
times differ); a change inside a huge file that keeps its size and misses both ends is not seen.

Paths matching the profile's ``state_ignore`` globs (e.g. ``.git/index``, which holds stat
times) are left out. Task files are data: a path that is absolute, climbs out with ``..`` or
goes through a symlink is refused, never written.

    write_files(workdir, {"notes/a.txt": "hello"})
    read_state(workdir, ignore=(".git/index",))    # {"files": {"notes/a.txt": "hello", ...}}
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

#: A regular file up to this size that is UTF-8 text is kept as its text.
MAX_TEXT_BYTES = 1 << 20
#: The most bytes of one file hashed: a longer file's state is its size and the SHA-256 of its
#: first and last 8 MiB (``hashed_bytes`` says how much was hashed).
MAX_HASHED_BYTES = 16 << 20
#: The most bytes hashed in one reading of the state: past it, a long file is its size only.
MAX_STATE_HASHED_BYTES = 64 << 20
#: The most entries (files, links, FIFOs, ...) one reading of the state walks.
MAX_STATE_ENTRIES = 10_000
_CHUNK = 1 << 20
_KINDS = {stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket", stat.S_IFCHR: "char-device",
          stat.S_IFBLK: "block-device", stat.S_IFDIR: "directory"}


class StateError(ValueError):
    """Task state that cannot be written (bad path, not text)."""


def check_files(files: Any) -> dict[str, str]:
    """The ``state.files`` mapping checked: relative posix paths inside the workdir, text."""
    if not isinstance(files, dict):
        raise StateError("state.files must be an object of relative path -> text")
    out: dict[str, str] = {}
    for path, text in files.items():
        if not isinstance(path, str) or not isinstance(text, str):
            raise StateError(f"state.files: {str(path)[:80]!r} must map a path to text")
        p = PurePosixPath(path)
        if (not path or p.is_absolute() or "\\" in path or "\0" in path
                or any(part in ("..", ".", "") for part in path.split("/"))):
            raise StateError(f"state.files: {path[:80]!r} is not a plain relative path")
        out[path] = text
    return out


def write_files(workdir: Path, files: dict[str, str]) -> None:
    """Write checked state files under ``workdir`` (which must exist and be empty)."""
    root = workdir.resolve()
    for rel, text in sorted(check_files(files).items()):
        target = root.joinpath(*rel.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.parent.resolve().is_relative_to(root) or target.is_symlink():
            raise StateError(f"state.files: {rel!r} leaves the workdir")
        target.write_text(text, encoding="utf-8")


def _ignored(rel: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) or rel.startswith(p.rstrip("/") + "/")
               for p in patterns)


def read_state(workdir: Path, ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """The workdir's files as JSON-able state (sorted paths; see the module docstring). Only
    regular files are opened; at most :data:`MAX_STATE_ENTRIES` entries are walked."""
    files: dict[str, Any] = {}
    budget = [MAX_STATE_HASHED_BYTES]  # bytes still to hash in this read
    cut = False
    for dirpath, dirnames, filenames in os.walk(workdir, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        rel_dir = base.relative_to(workdir).as_posix()
        for name in sorted(filenames + [d for d in dirnames if (base / d).is_symlink()]):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if _ignored(rel, ignore):
                continue
            if len(files) >= MAX_STATE_ENTRIES:
                cut = True
                break
            files[rel] = _entry(base / name, budget)
        if cut:
            break
        dirnames[:] = [d for d in dirnames if not (base / d).is_symlink()
                       and not _ignored(d if rel_dir == "." else f"{rel_dir}/{d}", ignore)]
    state: dict[str, Any] = {"files": dict(sorted(files.items()))}
    if cut:
        state["truncated"] = (f"more than {MAX_STATE_ENTRIES} entries: the rest are not in the "
                              "state")
    return state


def _entry(path: Path, budget: list[int]) -> Any:
    """One entry's state, never following a link nor opening anything but a regular file."""
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return {"symlink": os.readlink(path)}
        if not stat.S_ISREG(st.st_mode):
            return {"kind": _KINDS.get(stat.S_IFMT(st.st_mode), "other")}
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:  # a file vanishing or unreadable mid-walk is state too
        return {"unreadable": exc.strerror or str(exc)}
    with os.fdopen(fd, "rb") as f:
        try:
            st = os.fstat(f.fileno())  # what was opened: a file swapped in since lstat counts
            if not stat.S_ISREG(st.st_mode):
                return {"kind": _KINDS.get(stat.S_IFMT(st.st_mode), "other")}
            if st.st_size <= MAX_TEXT_BYTES:
                data = f.read(MAX_TEXT_BYTES + 1)
                if len(data) <= MAX_TEXT_BYTES:
                    return _content(data)
                f.seek(0)
            return _hashed(f, st.st_size, budget)
        except OSError as exc:
            return {"unreadable": exc.strerror or str(exc)}


def _hashed(f: Any, size: int, budget: list[int]) -> dict[str, Any]:
    """A file too long to keep as text: its size and the SHA-256 of (a bounded part of) it,
    read in chunks; past :data:`MAX_HASHED_BYTES`, its first and last half of that limit."""
    if budget[0] <= 0:
        return {"bytes": size, "hashed_bytes": 0}
    h = hashlib.sha256()
    limit = min(MAX_HASHED_BYTES, budget[0])
    if size <= limit:
        spans = [(0, size)]
    else:
        spans = [(0, limit // 2), (size - (limit - limit // 2), limit - limit // 2)]
    done = 0
    for offset, length in spans:
        f.seek(offset)
        while length > 0:
            chunk = f.read(min(_CHUNK, length))
            if not chunk:
                break
            h.update(chunk)
            length -= len(chunk)
            done += len(chunk)
    budget[0] -= done
    out: dict[str, Any] = {"sha256": h.hexdigest(), "bytes": size}
    if done < size:
        out["hashed_bytes"] = done
    return out


def _content(data: bytes) -> Any:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
