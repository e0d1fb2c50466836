"""``board.json``: the yardstick's file, every world model scored on every environment (typed,
versioned; docs/spec/board.md is authoritative).

    board = read_board("boards/dev/board.json")      # raises BoardError for a file it refuses
    for cell in board.cells:
        cell.model, cell.env, cell.dir, cell.exact.point

``envace board`` writes it (``envace.evaluation.board``); the dashboard's Board page reads it.
A cell is one ordinary audit directory (``dir``, relative to the board's directory), summarised
here: ``exact`` and ``json_f1`` (mean score with its cluster-bootstrap interval), the skill
against the best reference world model of that environment, ``by_state_change``, read vs write,
bits per byte where the model was scored by likelihood, coverage at ≤ 5 % divergence and the
AUROC where the model's confidence was recorded, own − real history divergence where both
histories were probed. Fields may be added (readers keep what
they do not know); the version changes when a field changes meaning.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envace.core.outfile import atomic_output
from envace.core.schema import json_text

BOARD_VERSION = "envace.board/1"
BOARD_FILE = "board.json"
_MODEL = ConfigDict(extra="allow")


def env_dirname(env: str) -> str:
    """``mcp:ledger`` -> ``mcp-ledger``: an environment's directory name in a board."""
    return env.replace(":", "-").replace("/", "-")


class BoardError(ValueError):
    """A board file that cannot be read (not JSON, another version, fields of the wrong type)."""


class Interval(BaseModel):
    """A point estimate and its interval (``lo``/``hi`` null where there is none)."""

    model_config = _MODEL
    point: float | None = None
    lo: float | None = None
    hi: float | None = None


class Stratum(BaseModel):
    """One stratum of a cell (a state-change bucket, read or write calls)."""

    model_config = _MODEL
    n: int = 0
    exact: Interval = Field(default_factory=Interval)
    divergence: Interval = Field(default_factory=Interval)
    skill: Interval | None = None


class Cell(BaseModel):
    """One model on one environment: its audit directory and headline figures."""

    model_config = _MODEL
    model: str
    env: str
    dir: str  #: the cell's audit directory, relative to the board's directory
    key: str  #: hash of model spec + options + input files: what makes the cell reusable
    status: Literal["done", "failed"] = "done"
    error: str | None = None
    audited_model: str | None = None
    command: str | None = None  #: what made the audit directory (a library call, as a CLI line)
    calls: int | None = None  #: scored calls
    trajectories: int | None = None
    exact: Interval = Field(default_factory=Interval)
    json_f1: Interval = Field(default_factory=Interval)
    divergence: Interval = Field(default_factory=Interval)
    best_reference: str | None = None  #: the reference the skill is against (by exact)
    skill: Interval = Field(default_factory=Interval)  #: exact skill vs best_reference
    by_state_change: dict[str, Stratum] = Field(default_factory=dict)
    cliff: bool | None = None  #: the audit's state-change cliff verdict
    read_write: dict[str, Stratum] = Field(default_factory=dict)
    bits_per_byte: Interval | None = None  #: with ``score: likelihood`` only
    #: with ``confidence: true``: the share of calls kept when only rehearsals confident enough
    #: to diverge on at most 5 % of them are trusted (the audit's ``coverage_at_risk["5%"]``)
    coverage_at_5pct: float | None = None
    auroc: Interval | None = None  #: with ``confidence: true``: low confidence -> divergence
    #: with ``--history both``: own − real history divergence (the audit's
    #: ``history.overall.diff``), paired, with its interval
    history_diff: Interval | None = None
    seconds: float | None = None


class Board(BaseModel):
    """``board.json``."""

    model_config = _MODEL
    schema_: str = Field(default=BOARD_VERSION, alias="schema")
    split: str
    envs: list[str]
    models: dict[str, dict[str, Any]]  #: name -> spec, as given in the models file
    cells: list[Cell]
    command: str | None = None

    def dump(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, mode="json")

    def cell(self, model: str, env: str) -> Cell | None:
        return next((c for c in self.cells if c.model == model and c.env == env), None)


def read_board(path: str | os.PathLike[str]) -> Board:
    """The board in ``path`` (a ``board.json`` or the directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / BOARD_FILE
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BoardError(f"cannot read {p}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise BoardError(f"{p} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BoardError(f"{p}: a board is a JSON object")
    if data.get("schema") != BOARD_VERSION:
        raise BoardError(f"{p}: schema {data.get('schema')!r}, this reader knows "
                         f"{BOARD_VERSION!r}")
    try:
        return Board.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(x) for x in err["loc"])
        raise BoardError(f"{p}: {where}: {err['msg']}") from None


def write_board(path: str | os.PathLike[str], board: Board) -> Path:
    """Write ``board`` as ``path/board.json`` (atomically: a reader sees the old or the new)."""
    out = Path(path) / BOARD_FILE
    with atomic_output(out) as tmp:  # never through a link; no temporary left on a failure
        # a lone surrogate (a model path "/tmp/x\ud800y") as its \\ud800 escape
        tmp.write_text(json_text(board.dump(), indent=1) + "\n", encoding="utf-8")
    return out
