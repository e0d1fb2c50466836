"""Which directory ``envace board`` may write, checked before it writes anything.

    check_out("boards/dev", ["lookup", "edit"], ["bfcl"], inputs=["models.yaml"])  # UsageError

``--out`` must be one of:

- a path that does not exist yet (the board makes it);
- an empty directory (or one holding only the board's lock file, ``.board.lock``, which a
  board stopped by ``kill -9`` leaves);
- a board this command made: its ``board.json`` reads as ``envace.board/1``
  (``envace.core.board.read_board``). Every run writes one before its first cell, so a board
  stopped during its first export is still recognised.

Anything else is refused (UsageError, exit 2, nothing written): a regular file, a directory of
other files, a ``board.json`` that is not a board (``{"x": 1}``, a truncated one, a FIFO).

Within the directory, nothing is followed: a path the board writes (``board.json``,
``board.md``, ``board.log``, ``.board.lock``, ``charts/`` and its charts, ``cells/``, each
``cells/<model>/``, each cell's audit directory and ``.cell.json``, ``inputs/`` and
``inputs/<env>/``) that is a symbolic link is refused, naming it. It is refused rather than
replaced: the link was put there by someone, most likely to keep an audit elsewhere, and
whatever it points to is another run's, which the board must neither write over nor delete.
(An input trajectory file ``inputs/<env>/<split>.jsonl`` may be a link: the board only reads
it; one that is missing is exported, and a dangling link is refused by the writer.)

The board never writes over its own inputs: the models file, ``--mcp-config`` and
``--mcp-tasks`` may not be one of the board's files (``cp models.yaml OUT/board.md`` then
``--models OUT/board.md`` is refused, where the report used to replace the models file).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from envace.core.board import BOARD_FILE, BoardError, env_dirname, read_board
from envace.core.errors import UsageError

LOCK_FILE = ".board.lock"  #: held by the one envace board writing a directory
FILES = (BOARD_FILE, "board.md", "board.log", LOCK_FILE)  #: the board's own top-level files
DIRS = ("charts", "cells", "inputs")  #: and its folders


def owned_paths(root: Path, models: Iterable[str], envs: Sequence[str]) -> list[Path]:
    """Every path the board writes (or writes into) under ``root``."""
    paths = [root / n for n in (*FILES, *DIRS)]
    paths += [root / "charts" / f"{env_dirname(e)}.png" for e in envs]
    paths += [root / "inputs" / env_dirname(e) for e in envs]
    for m in models:
        paths.append(root / "cells" / m)
        for e in envs:
            paths += [root / "cells" / m / env_dirname(e),
                      root / "cells" / m / f"{env_dirname(e)}.cell.json"]
    return paths


def _refuse_inputs(root: Path, inputs: Iterable[str | os.PathLike[str]]) -> None:
    """UsageError when an input is one of the board's files or lies where the board writes."""
    writes_into = [(root / d).resolve() for d in ("cells", "charts")]
    for given in inputs:
        p = Path(given)
        if not p.exists():
            continue
        real = p.resolve()
        for name in FILES:
            own = root / name
            if own.exists() and os.path.samefile(own, p):
                raise UsageError(f"{given} is an input of this board and {own} is where the "
                                 "board writes: refusing to write over it; move the input or "
                                 "choose another --out")
        if any(real.is_relative_to(d) for d in writes_into):
            raise UsageError(f"{given} is an input of this board and lies in {root}'s "
                             "cells/ or charts/, which the board writes: move it or choose "
                             "another --out")


def check_out(out: str | os.PathLike[str], models: Iterable[str], envs: Sequence[str],
              inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """``out`` as a Path when the board may write it (see the module docstring); UsageError
    naming the reason otherwise. Reads, never writes."""
    root = Path(out)
    if not root.exists():
        if root.is_symlink():
            raise UsageError(f"--out {root} is a dangling symbolic link: refusing to write "
                             "through it")
        return root
    if not root.is_dir():
        raise UsageError(f"--out {root} exists and is not a directory: a board is a directory; "
                         "choose a new path")
    models = list(models)
    _refuse_inputs(root, inputs)
    names = {e.name for e in os.scandir(root)}
    board = root / BOARD_FILE
    if BOARD_FILE in names:
        st = board.lstat()
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{board} is not a regular file: not a board of envace board; "
                             "refusing to write over it (choose another --out)")
        try:
            read_board(board)
        except BoardError as exc:
            raise UsageError(f"--out {root} holds a board.json that is not a board of envace "
                             f"board ({str(exc).splitlines()[0]}): refusing to write over it; "
                             "choose a new or empty --out") from None
    elif names - {LOCK_FILE}:
        shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
        raise UsageError(f"--out {root} is a directory holding other files ({shown}) and no "
                         "board.json: envace board writes only a new or empty directory or "
                         "a board it made; choose another --out")
    for p in owned_paths(root, models, envs):
        if p.is_symlink():
            raise UsageError(f"{p} is a symbolic link: the board never writes through one "
                             "(it would write over what it points to); remove the link or "
                             "choose another --out")
    return root
