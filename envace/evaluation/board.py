"""``envace board``: every world model of a models file probed on every environment, resumable.

    board = run_board(read_models("models.yaml"), ["bfcl", "agentdojo", "tau2"], "dev",
                      "boards/dev")

The board directory holds:

- ``inputs/<env>/<split>.jsonl`` and ``inputs/<env>/train.jsonl``: the real trajectories of the
  split scored and of the train split (exported once; the references, the ranker, a memory and
  the hybrid read train only);
- ``cells/<model>/<env>/``: one ordinary audit directory per cell, made by the probe's library
  functions (``audit.probe.run_probe`` for a reference world model or the ranker,
  ``envace.evaluation.model_probe.probe_model`` for a local model,
  ``envace.evaluation.endpoint_probe.probe_endpoint`` for a served one), every cell with the
  train split as ``--reference`` so its skill is against that environment's best reference;
  ``cells/<model>/<env>.cell.json`` beside it records the cell's key;
- ``board.json`` (``envace.core.board``, docs/spec/board.md), ``board.md``, ``charts/<env>.png``
  and ``board.log`` (one line per event, appended).

``--out`` is new, empty or a board this command made; nothing in it is written through a link
and no input is written over (``board_out.check_out``, checked before anything is written).

A cell is finished when its key (``board_models.cell_key``: model spec, options, input file
hashes, a model folder's files) matches the one recorded and its ``summary.json`` reads: it is
never recomputed. A changed model, option or input changes the keys of exactly its cells. A cell
that fails is recorded ``failed`` with its error and tried again next time; the others go on.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from audit.pipeline import reference_triples
from audit.probe import HISTORY_CHOICES, run_probe
from audit.scoring.settings import AuditOptions
from audit.store.records import MAX_SUMMARY_BYTES
from audit.worlds.memory import NOTE_CHARS, MemoryOptions, ResponseMemory, note_chars
from audit.worlds.ranker import fit_ranker
from audit.worlds.reference import build_reference
from envace.core.board import Board, Cell, env_dirname, write_board
from envace.core.envs.family import family
from envace.core.envs.limits import CallLimits
from envace.core.errors import UsageError
from envace.core.export import export_real
from envace.core.infile import read_small_bytes
from envace.core.layout import AUDIT
from envace.core.outfile import atomic_output, write_text
from envace.core.schema import TrajectoryWriter, json_text, read_trajectories
from envace.core.worldmodel import from_lookup
from envace.evaluation import likelihood
from envace.evaluation.board_figures import cell_figures
from envace.evaluation.board_models import ModelSpec, cell_key, file_hash, uses_history
from envace.evaluation.board_out import LOCK_FILE, check_out
from envace.evaluation.board_report import write_report
from envace.evaluation.endpoint_likelihood import served_cut
from envace.evaluation.endpoint_probe import probe_endpoint
from envace.evaluation.likelihood import probe_likelihood
from envace.evaluation.model_probe import context_length, probe_model
from envace.model.endpoint import EndpointClient, EndpointError
from envace.model.models import (
    auto_threads,
    context_problem,
    default_cache_dir,
    load_model,
    resolve_model,
)
from envace.model.windows import prompt_budget

TRAIN = "train"


@dataclass
class BoardOptions:
    """What a board's cells share (every one of them is in each cell's key)."""

    split: str = "dev"
    limit: int = 0  #: at most this many trajectories per environment (0: all)
    plots: bool = False  #: each cell's audit plots (the board draws its own charts)
    call_timeout_s: float | None = 30.0
    quiet: bool = False
    history: str = "real"  #: ``both``: generating models probed with own and real histories

    def keyed(self, spec: ModelSpec | None = None) -> dict[str, Any]:
        """The options in a cell's key: ``--limit``, and ``--history`` for a model it changes
        (``board_models.uses_history``) when it is not the default ``real``, so a board made
        without it keeps its keys and ``--history both`` recomputes exactly those cells."""
        out: dict[str, Any] = {"limit": self.limit}
        if self.history != "real" and spec is not None and uses_history(spec):
            out["history"] = self.history
        return out

    def histories(self, spec: ModelSpec) -> tuple[str, ...]:
        """The histories ``spec``'s cell is probed with (``audit.probe.HISTORY_CHOICES``)."""
        return HISTORY_CHOICES[self.history] if uses_history(spec) else ("real",)


@dataclass
class Progress:
    """One line per cell event on stderr and in ``board.log``, with an estimate of the time
    a cell takes (from the seconds per call of the same model's earlier cells)."""

    log: Path
    quiet: bool = False
    per_call: dict[str, float] = field(default_factory=dict)

    def line(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        # never through a link; a lone surrogate (a model path "/tmp/x\ud800y") as its escape
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        with open(fd, "a", encoding="utf-8", errors="backslashreplace") as f:
            f.write(f"{stamp} {text}\n")
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    def estimate(self, model: str, calls: int) -> str:
        rate = self.per_call.get(model)
        return "estimate n/a (first cell of this model)" if rate is None else (
            f"estimate ~{rate * calls:.0f} s")


def _count_calls(path: Path, limit: int) -> int:
    n = t = 0
    for item in read_trajectories(path):
        if item.trajectory is None:
            continue
        t += 1
        if limit and t > limit:
            break
        n += len(item.trajectory.tool_steps())
    return n


def export_inputs(env: str, split: str, out: Path, log: Callable[[str], None]) -> dict[str, Path]:
    """The split's and the train split's real trajectories of ``env`` under ``out/inputs``
    (exported when missing; an existing file is kept: its hash keys the cells)."""
    folder = out / "inputs" / env_dirname(env)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for s in dict.fromkeys([split, TRAIN]):
        path = folder / f"{s}.jsonl"
        paths[s] = path
        if path.is_file():
            continue
        fam = family(env)
        skipped: list[tuple[str, str]] = []
        t0 = time.perf_counter()
        n = 0
        with atomic_output(str(path)) as tmp, TrajectoryWriter(tmp, mode="w") as w:
            for traj in export_real(fam.split_tasks(s, "task"), limits=CallLimits(),
                                    skipped=skipped):
                w.write(traj)
                n += 1
        log(f"exported {n} real trajectories of {env} {s} to {path} "
            f"({time.perf_counter() - t0:.0f} s" + (f", {len(skipped)} skipped)" if skipped
                                                     else ")"))
    return paths


# ---------------------------------------------------------------- the cells


def _options(train: Path, plots: bool, call_timeout_s: float | None) -> Any:
    return AuditOptions(reference=str(train), progress=False, plots=plots,
                        call_timeout_s=call_timeout_s)


def _probe_reference(spec: ModelSpec, dev: Path, train: Path, out: Path, opts: Any,
                     limit: int) -> tuple[dict[str, Any], str]:
    ref = build_reference(str(spec.reference), reference_triples(train))
    summary = run_probe([str(dev)], out, from_lookup(ref), opts, limit,
                        label=f"reference:{spec.reference}")
    return summary, (f"audit.probe.run_probe(from_lookup(build_reference({spec.reference!r}, "
                     f"{train}))) on {dev} --reference {train}")


def _probe_ranker(dev: Path, train: Path, out: Path, opts: Any, limit: int
                  ) -> tuple[dict[str, Any], str]:
    ranker = fit_ranker(ResponseMemory.from_file(train), train)
    tally: dict[str, int] = {}
    summary = run_probe([str(dev)], out, None, opts, limit, label=f"ranker(k={ranker.k})",
                        answer_batch=ranker.batch(tally), task_ids=True,
                        extra=lambda: {"world_model": {"ranker": ranker.block(tally)}})
    return summary, f"envace probe --ranker {train} {dev} --reference {train}"


def _grounding(spec: ModelSpec, train: Path, max_chars: int | None = None) -> Any:
    return MemoryOptions(
        memory=ResponseMemory.from_file(train) if spec.memory_k else None,
        k=spec.memory_k or 3,
        hybrid=ResponseMemory.from_file(train) if spec.hybrid else None,
        max_chars=NOTE_CHARS if max_chars is None else max_chars)


def _flags(spec: ModelSpec, train: Path) -> str:
    return ((f" --memory {train} --memory-k {spec.memory_k}" if spec.memory_k else "")
            + (f" --hybrid {train}" if spec.hybrid else ""))


def likelihood_available() -> bool:
    """Whether this build can score a model by likelihood (``envace probe --likelihood``,
    ``envace.evaluation.likelihood.probe_likelihood``)."""
    return callable(getattr(likelihood, "probe_likelihood", None))


class _Models:
    """Local models loaded once per board run (a model scored on three environments loads
    once)."""

    def __init__(self) -> None:
        self.loaded: dict[str, tuple[Any, Any, Path]] = {}

    def get(self, name: str) -> tuple[Any, Any, Path]:
        if name not in self.loaded:
            path = resolve_model(name, default_cache_dir())
            import torch

            torch.set_num_threads(auto_threads())
            model, tok = load_model(path)
            self.loaded[name] = (model, tok, Path(path))
        return self.loaded[name]


def _history_flag(histories: Sequence[str]) -> str:
    return next((f" --history {k}" for k, v in HISTORY_CHOICES.items()
                 if tuple(v) == tuple(histories) and k != "real"), "")


def _probe_model(spec: ModelSpec, models: _Models, dev: Path, train: Path, out: Path,
                 opts: Any, limit: int, histories: Sequence[str] = ("real",)
                 ) -> tuple[dict[str, Any], str]:
    model, tok, path = models.get(str(spec.model))
    why = context_problem(spec.context, path)
    if why:
        raise UsageError(f"model {spec.model}: {why}")
    context = spec.context or context_length(path, model)
    if spec.score == "likelihood":  # bits per byte of the real responses: nothing generated

        summary = probe_likelihood(model, tok, [str(dev)], out, opts, context, limit,
                                   label=str(path))
        return summary, (f"envace probe --model {spec.model} {dev} --likelihood --reference "
                         f"{train}{_context_flag(spec)}")
    grounding = replace(_grounding(spec, train),
                        max_chars=note_chars(prompt_budget(context, spec.max_new_tokens)))
    summary = probe_model(model, tok, [str(dev)], out, opts, context, spec.max_new_tokens,
                          limit, label=str(path), grounding=grounding, histories=histories,
                          confidence=spec.confidence)
    return summary, (f"envace probe --model {spec.model} {dev} --reference {train} "
                     f"--max-new-tokens {spec.max_new_tokens}{_flags(spec, train)}"
                     + (" --confidence" if spec.confidence else "") + _context_flag(spec)
                     + _history_flag(histories))


def _probe_endpoint(spec: ModelSpec, dev: Path, train: Path, out: Path, opts: Any,
                    limit: int, histories: Sequence[str] = ("real",)
                    ) -> tuple[dict[str, Any], str]:
    url, _, name = str(spec.endpoint).partition("#")
    try:
        client = EndpointClient(url, name, max_tokens=spec.max_new_tokens)
        client.check()
    except (ValueError, EndpointError) as exc:
        raise UsageError(f"endpoint {spec.endpoint}: {exc}") from None
    cut = None if spec.tokenizer is None else served_cut(spec.tokenizer, spec.context)
    summary = probe_endpoint(client, [str(dev)], out, opts, limit=limit,
                             grounding=_grounding(spec, train), histories=histories, cut=cut)
    return summary, (f"envace probe --endpoint {url} --model {name} {dev} --reference "
                     f"{train} --max-new-tokens {spec.max_new_tokens}{_flags(spec, train)}"
                     + (f" --tokenizer {spec.tokenizer}" if spec.tokenizer else "")
                     + _context_flag(spec) + _history_flag(histories))


def _context_flag(spec: ModelSpec) -> str:
    return f" --context {spec.context}" if spec.context else ""


def check_models(models: dict[str, ModelSpec]) -> None:
    """Refuse, before anything runs, what this build cannot do (``score: likelihood``)."""
    served = [n for n, s in models.items() if s.score == "likelihood" and s.endpoint]
    if served:
        raise UsageError(f"model(s) {', '.join(served)}: score: likelihood is wired for local "
                         "models on the board; score a served one with `envace probe "
                         "--endpoint ... --likelihood`")
    wanting = [n for n, s in models.items() if s.score == "likelihood"]
    if wanting and not likelihood_available():
        raise UsageError(f"model(s) {', '.join(wanting)}: score: likelihood needs `envace "
                         "probe --likelihood` (bits per byte), which this build does not have "
                         "yet; use score: generation")


# ---------------------------------------------------------------- the board


def _inputs_of(paths: dict[str, Path], split: str) -> dict[str, str]:
    """The hashes of the files a cell reads (every cell reads train: its --reference)."""
    return {split: file_hash(paths[split]), TRAIN: file_hash(paths[TRAIN])}


def _read_sidecar(path: Path) -> dict[str, Any] | None:
    """A cell's sidecar or stored summary, or None (missing, unreadable, not a regular file:
    a FIFO is never waited on, tester B17c)."""
    try:
        data = json.loads(read_small_bytes(path, MAX_SUMMARY_BYTES, "the cell file"))
    except (UsageError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def run_board(models: dict[str, ModelSpec], envs: Sequence[str], out: str | os.PathLike[str],
              opts: BoardOptions | None = None, command: str | None = None,
              inputs: Sequence[str | os.PathLike[str]] = ()) -> Board:
    """Score every model on every environment into ``out`` (see the module docstring); the
    board. Raises UsageError before anything is written for a model this build cannot score,
    or an ``out`` the board may not write (``board_out.check_out``: not new, empty or a board
    of its own; a link where it writes; one of ``inputs``, the files the caller read)."""
    opts = opts or BoardOptions()
    check_models(models)
    root = check_out(out, models, envs, inputs)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):  # one board at a time in a directory (tester B24)
        check_out(root, models, envs, inputs)  # as found once the lock is held
        return _run_board(models, envs, root, opts, command)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``root/.board.lock`` while a board runs there: a second
    ``envace board`` into the same ``--out`` is refused (UsageError) before it writes; the
    kernel drops the lock when the process dies. The file is removed when the board ends, done
    or failed (only a ``kill -9`` leaves it, which the next run reuses). Removing it is safe
    because a lock is only taken on the file the path names once it is held: a run that
    locked a file another had just removed tries again on the new one."""
    path = root / LOCK_FILE
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        fd = os.open(path, flags, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise UsageError(f"{root} is being written by another envace board: wait for it "
                             "to end (or stop it), then run again") from None
        held = os.fstat(fd)
        try:
            now = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)  # the file was removed by the run that held it: lock the new one
    else:
        raise UsageError(f"{root}: cannot hold {LOCK_FILE} (another envace board keeps "
                         "replacing it)")
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # while still held: no one locks this file after it is gone
        os.close(fd)


def _run_board(models: dict[str, ModelSpec], envs: Sequence[str], root: Path,
               opts: BoardOptions, command: str | None) -> Board:
    if not (root / "board.json").exists():  # the mark of a board of its own, from the start
        write_board(root, Board(split=opts.split, envs=list(envs),
                                models={n: s.given() for n, s in models.items()}, cells=[],
                                command=command))
    progress = Progress(root / "board.log", opts.quiet)
    progress.line(f"board: {len(models)} model(s) x {len(envs)} environment(s), split "
                  f"{opts.split}" + (f", at most {opts.limit} trajectories each"
                                     if opts.limit else ""))
    loaded = _Models()
    cells: list[Cell] = []
    total = len(models) * len(envs)
    i = 0
    for env in envs:
        paths = export_inputs(env, opts.split, root, progress.line)
        calls = _count_calls(paths[opts.split], opts.limit)
        for name, spec in models.items():
            i += 1
            cells.append(_cell(i, total, name, spec, env, paths, calls, root, opts, progress,
                               loaded))
            board = Board(split=opts.split, envs=list(envs),
                          models={n: s.given() for n, s in models.items()}, cells=cells,
                          command=command)
            write_board(root, board)  # after every cell: a stopped board keeps what it made
    board = Board(split=opts.split, envs=list(envs),
                  models={n: s.given() for n, s in models.items()}, cells=cells, command=command)
    _best_references(board)
    write_board(root, board)
    write_report(root, board)
    done = sum(c.status == "done" for c in cells)
    progress.line(f"board: {done} of {total} cells done; wrote {root / 'board.json'}")
    return board


def _cell(i: int, total: int, name: str, spec: ModelSpec, env: str, paths: dict[str, Path],
          calls: int, root: Path, opts: BoardOptions, progress: Progress, loaded: _Models
          ) -> Cell:
    rel = Path("cells") / name / env_dirname(env)
    audit_dir = root / rel
    sidecar = root / "cells" / name / f"{env_dirname(env)}.cell.json"
    tag = f"[{i}/{total}] {name} x {env}"
    try:  # a model folder that cannot be listed (/proc, too many files) fails this cell only
        key = cell_key(spec, env, opts.split, _inputs_of(paths, opts.split), opts.keyed(spec))
    except (OSError, ValueError) as exc:
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        progress.line(f"{tag}: FAILED ({why})")
        return Cell(model=name, env=env, dir=str(rel), key="unkeyed", status="failed",
                    error=why)
    known = _read_sidecar(sidecar)
    if known and known.get("key") == key and known.get("status") == "done":
        summary = _read_sidecar(audit_dir / AUDIT.summary)
        try:
            figures = cell_figures(summary) if summary is not None else None
        except Exception as exc:  # noqa: BLE001 - a tampered stored summary: computed again
            progress.line(f"{tag}: its stored summary cannot be read ({type(exc).__name__}): "
                          "computed again")
            figures = None
        if figures is not None:
            progress.line(f"{tag}: finished earlier (key {key}), not recomputed")
            return Cell(model=name, env=env, dir=str(rel), key=key,
                        command=known.get("command"), seconds=known.get("seconds"),
                        **figures)
    progress.line(f"{tag}: running on {calls} calls, {progress.estimate(name, calls)}")
    train, dev = paths[TRAIN], paths[opts.split]
    aopts = _options(train, opts.plots, opts.call_timeout_s)
    t0 = time.perf_counter()
    try:
        if spec.kind == "reference":
            summary, command = _probe_reference(spec, dev, train, audit_dir, aopts, opts.limit)
        elif spec.kind == "ranker":
            summary, command = _probe_ranker(dev, train, audit_dir, aopts, opts.limit)
        elif spec.kind == "model":
            summary, command = _probe_model(spec, loaded, dev, train, audit_dir, aopts,
                                            opts.limit, opts.histories(spec))
        else:
            summary, command = _probe_endpoint(spec, dev, train, audit_dir, aopts, opts.limit,
                                               opts.histories(spec))
    except Exception as exc:  # noqa: BLE001 - one cell's failure is its record, not the board's
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        progress.line(f"{tag}: FAILED ({why}); it is tried again next time")
        write_text(sidecar, json_text({"key": key, "status": "failed", "error": why}) + "\n")
        return Cell(model=name, env=env, dir=str(rel), key=key, status="failed", error=why)
    seconds = time.perf_counter() - t0
    if calls:
        progress.per_call[name] = seconds / calls
    figures = cell_figures(summary)
    write_text(sidecar, json_text({"key": key, "status": "done", "command": command,
                                   "seconds": seconds}) + "\n")
    ex = figures["exact"]
    shown = "n/a" if ex.point is None else (
        f"{ex.point:.3f}" + ("" if ex.lo is None else f" [{ex.lo:.3f}, {ex.hi:.3f}]"))
    progress.line(f"{tag}: done in {seconds:.0f} s, exact {shown}")
    return Cell(model=name, env=env, dir=str(rel), key=key, command=command, seconds=seconds,
                **figures)


def _best_references(board: Board) -> None:
    """Per environment, the best reference's name is each cell's ``best_reference`` where its
    audit did not name one (a failed cell)."""
    for env in board.envs:
        named = [c.best_reference for c in board.cells if c.env == env and c.best_reference]
        if named:
            for c in board.cells:
                if c.env == env and c.best_reference is None:
                    c.best_reference = max(set(named), key=named.count)
