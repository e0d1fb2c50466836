"""A trajectory's working directory: the task's state files written in, the state read back.

The state of an MCP environment is the files of its workdir (the server's working directory):
``{"files": {relative posix path: text}}``, a file that is not UTF-8 text (or over
:data:`MAX_TEXT_BYTES`) as ``{"sha256": ..., "bytes": n}``, a symlink as ``{"symlink": target}``.
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
from pathlib import Path, PurePosixPath
from typing import Any

MAX_TEXT_BYTES = 1 << 20


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
    """The workdir's files as JSON-able state (sorted paths; see the module docstring)."""
    files: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(workdir, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        rel_dir = base.relative_to(workdir).as_posix()
        for name in sorted(filenames + [d for d in dirnames if (base / d).is_symlink()]):
            path = base / name
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if _ignored(rel, ignore):
                continue
            if path.is_symlink():
                files[rel] = {"symlink": os.readlink(path)}
                continue
            try:
                data = path.read_bytes()
            except OSError as exc:  # a file vanishing or unreadable mid-walk is state too
                files[rel] = {"unreadable": exc.strerror or str(exc)}
                continue
            files[rel] = _content(data)
        dirnames[:] = [d for d in dirnames if not (base / d).is_symlink()
                       and not _ignored(d if rel_dir == "." else f"{rel_dir}/{d}", ignore)]
    return {"files": dict(sorted(files.items()))}


def _content(data: bytes) -> Any:
    if len(data) <= MAX_TEXT_BYTES:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
