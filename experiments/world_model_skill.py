"""Benchmark: world-model skill on held-out scenarios (BFCL or AgentDojo), per world model.

    .venv/bin/python -m experiments.world_model_skill \
        --cell "tiny cold start=--model data/models/tiny-sft" \
        --cell "tiny + memory=--model data/models/tiny-sft --memory train.jsonl" \
        --cell "tiny + hybrid=--model data/models/tiny-sft --hybrid train.jsonl" \
        --cell "tiny+both=--model data/models/tiny-sft --memory train.jsonl --hybrid train.jsonl" \
        --keep runs/world_model_skill

Each cell is a label and the arguments `envace probe` takes before its input file: a model
folder, and the memory / hybrid options. ``train.jsonl`` in a cell means the train split's real
trajectories (`envace data export-real --split train --out train.jsonl`; the bench writes it under
``--keep``). Every cell is probed teacher-forced and greedy on every ground-truth call of the dev
split (``envace probe --model ... dev.jsonl --reference train.jsonl --out DIR``, one thread),
and its skill read from the audit: against the best reference world model (since 2026-12-02 the
``edit`` reference: the most similar training call's response with the call's arguments copied
in; before, the lookup of training responses) and against each reference (the table shows
``lookup`` and ``edit``), with the bootstrap interval resampling the environment's unit
(BFCL: the scenario; ``resampling_unit`` in each cell), overall, by read/write tool and by
novelty (``skill.by_scorer.exact`` and ``skill.by_mutates_state`` /
``skill.by_novelty`` of ``summary.json``).

A label ending in ``#sN`` is seed N of a trained cell (``tiny envace 30 steps#s1=--model
runs/...``): the table adds one row per label with the seeds' mean and range. The test split is
never read. ``--env agentdojo`` does the same on AgentDojo's splits (give it its own ``--name``
and ``--keep``: the exported files under ``--keep`` are the environment's). Writes
``bench/results/<name>.json`` after every cell (machine, load, seconds, each
cell's skill block) with, under ``best``, the cell with the highest skill point as ``probe_args``
(with the files it needs and, for a model folder given with ``--built PATH=COMMAND``, the
command that made it); ``--collect`` rebuilds from the audits kept under ``--keep``;
``--merge`` adds the cells probed now to those of the existing result file (whose audits need
not be kept here), a cell probed again replacing the one of its label. A cell whose model folder
was made by `envace sft` also records, as ``model_made``, what its ``envace_sft.json`` says the
training did (steps reached, what stopped it, the steps asked, its command), and a folder cut
short by its time budget is warned about: a ``--built`` command can go stale when a default
changes, and this records what it actually did. Two runs that write one ``--name`` at once
each write their own cells over the other's: run concurrent probes under their own ``--name``
(and ``--keep`` where their cells' folders could collide), then write the real name once with
``--merge --collect`` over one ``--keep`` holding every audit.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import machine
from bench.machine import table, write_result
from envace.core.layout import AUDIT
from envace.model.models import sft_made

TRAIN = "train.jsonl"
EXPORT = {TRAIN: "envace data export-real --split train --out train.jsonl",
          "dev.jsonl": "envace data export-real --split dev --out dev.jsonl"}
ENVS = ("bfcl", "agentdojo")


def exports(env: str = "bfcl") -> dict[str, str]:
    """The commands that write the train and dev files of `env` (BFCL's carry no ``--env``)."""
    if env == "bfcl":
        return dict(EXPORT)
    return {f: cmd.replace("export-real ", f"export-real --env {env} ")
            for f, cmd in EXPORT.items()}


def _pair(spec: str, form: str) -> tuple[str, str]:
    """``KEY=VALUE`` -> (key, value), both stripped and non-empty; else ValueError naming `form`."""
    key, sep, value = spec.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise ValueError(f"expected {form}, got {spec!r}")
    return key.strip(), value.strip()


def parse_cell(spec: str) -> tuple[str, list[str]]:
    """``LABEL=ARGS`` -> (label, argument list); the label may not be empty."""
    label, rest = _pair(spec, "a cell as LABEL=PROBE-ARGS")
    return label, shlex.split(rest)


def base_label(label: str) -> str:
    """The cell a seed belongs to: ``name#s2`` -> ``name``."""
    head, sep, tail = label.rpartition("#s")
    return head if sep and tail.isdigit() else label


def dirname(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)


def cell_result(summary: dict[str, Any], scorer: str = "exact") -> dict[str, Any]:
    """The figures of one probed cell, from its ``summary.json``."""
    sk = summary.get("skill") or {}
    overall = (sk.get("by_scorer") or {}).get(scorer) or {}
    return {"skill": {k: overall.get(k) for k in ("point", "lo", "hi", "f_model", "f_ref", "n",
                                                   "best_reference", "mc_error", "method")},
            "against": overall.get("against"),
            "by_mutates_state": (sk.get("by_mutates_state") or {}).get(scorer),
            "by_novelty": (sk.get("by_novelty") or {}).get(scorer),
            "divergence_rate": summary.get("divergence_rate"),
            "divergence_ci": summary.get("divergence_ci"),
            "resampling_unit": summary.get("resampling_unit"),
            "clusters": (summary.get("interval") or {}).get("clusters"),
            "audited_model": summary.get("audited_model"),
            "world_model": summary.get("world_model"),
            "seconds": summary.get("seconds")}


def model_made(probe_args: list[str]) -> dict[str, Any] | None:
    """How the model folder a cell probes (``--model DIR``) was made
    (`envace.model.models.sft_made`); None without ``--model`` or for a folder `envace sft` did
    not make."""
    if "--model" not in probe_args or probe_args.index("--model") + 1 >= len(probe_args):
        return None
    return sft_made(probe_args[probe_args.index("--model") + 1])


def short_build_warning(made: dict[str, Any] | None) -> str | None:
    """A warning when a folder's training was cut by its time budget (``max_steps`` and
    ``epochs`` are the ends it was asked for)."""
    if not made or made.get("stopped_by") != "time budget":
        return None
    return (f"warning: {made['folder']} stopped by {made['stopped_by']} at {made['steps']} "
            f"of {made['max_steps']} steps")


def best_cell(cells: dict[str, dict[str, Any]], built: dict[str, str] | None = None,
              files: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The cell with the highest skill (ties: the first), as ``probe_args``, with the commands
    that make the files and model folders it names (`EXPORT`, `built`). Cells are ranked by
    their skill against ``lookup``, which every cell has (cells measured before the ``edit``
    reference existed have no skill against it); on the same calls that is the order of
    their skill against any one reference."""
    scored = [(skill_against(c, "lookup").get("point"), label) for label, c in cells.items()]
    scored = [(p, label) for p, label in scored if p is not None]
    if not scored:
        return None
    point, label = max(scored, key=lambda x: x[0])
    args = cells[label]["probe_args"]
    return {"label": label, "probe_args": args, "skill": cells[label]["skill"],
            "files": {f: cmd for f, cmd in {**(files or EXPORT), **(built or {})}.items()
                      if f in args}}


def _pct(v: Any) -> str:
    return "n/a" if v is None else f"{v:+.3f}"


def skill_against(cell: dict[str, Any], reference: str) -> dict[str, Any]:
    """A cell's skill against `reference`: from its audit's ``against`` block; for a cell
    measured before that block existed, its ``skill`` when that was against `reference`, else
    the point alone from the exact rates (``f_ref`` of `reference` taken from any other cell of
    the same calls is not known here: None)."""
    against = (cell.get("against") or {}).get(reference)
    if against:
        return against
    s = cell.get("skill") or {}
    return s if s.get("best_reference") == reference else {}


def rows_for(cells: dict[str, dict[str, Any]]) -> list[list[Any]]:
    rows = []
    groups: dict[str, list[str]] = {}
    for label in cells:
        groups.setdefault(base_label(label), []).append(label)
    for label, c in cells.items():
        s, rw = c["skill"], c.get("by_mutates_state") or {}
        lk, ed = skill_against(c, "lookup"), skill_against(c, "edit")
        rows.append([label, s.get("n"), _pct(s.get("f_model")),
                     _pct(lk.get("point")), f"[{_pct(lk.get('lo'))}, {_pct(lk.get('hi'))}]",
                     _pct(ed.get("point")), f"[{_pct(ed.get('lo'))}, {_pct(ed.get('hi'))}]",
                     s.get("best_reference"),
                     _pct((rw.get("read") or {}).get("point")),
                     _pct((rw.get("write") or {}).get("point"))])
    for base, members in groups.items():
        for ref, col in (("lookup", 3), ("edit", 5)):
            pts = [skill_against(cells[m], ref).get("point") for m in members]
            pts = [p for p in pts if p is not None]
            if len(members) > 1 and pts:
                row = [f"{base} (mean of {len(pts)} seeds, vs {ref})", "", "", "", "", "", "",
                       "", "", ""]
                row[col], row[col + 1] = (_pct(sum(pts) / len(pts)),
                                          f"range {_pct(min(pts))}..{_pct(max(pts))}")
                rows.append(row)
    return rows


HEADER = ["world model", "steps", "exact", "skill vs lookup", "95% CI (the unit)",
          "skill vs edit", "95% CI (the unit)", "best reference", "skill read",
          "skill write"]


def parse_built(spec: str) -> tuple[str, str]:
    """``PATH=COMMAND`` -> (path, command): how a model folder a cell names was made."""
    return _pair(spec, "--built as PATH=COMMAND")


def previous_cells(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The cells and `built` commands of an earlier result file (`--merge`); ValueError (one
    line) when it is missing or not such a file."""
    try:
        old = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--merge: cannot read {path}: {exc}") from None
    cells, built = old.get("cells") if isinstance(old, dict) else None, old.get("built") or {}
    if not isinstance(cells, dict) or not all(
            isinstance(c, dict) and isinstance(c.get("probe_args"), list) for c in cells.values()):
        raise ValueError(f"--merge: {path} holds no world-model cells")
    return dict(cells), dict(built)


def command_for(cells: dict[str, list[str]], built: dict[str, str], limit: int = 0,
                env: str = "bfcl", name: str = "world_model_skill",
                keep: str = "runs/world_model_skill") -> str:
    """The bench command that probes all these cells again (a merged result's `command`)."""
    parts = ["python", "-m", "experiments.world_model_skill", "--keep", keep]
    if env != "bfcl":
        parts += ["--env", env]
    if name != "world_model_skill":
        parts += ["--name", name]
    if limit:
        parts += ["--limit", str(limit)]
    for path, cmd in built.items():
        parts += ["--built", f"{path}={cmd}"]
    for label, probe_args in cells.items():
        parts += ["--cell", f"{label}={shlex.join(probe_args)}"]
    return shlex.join(parts)


def _report(name: str, info: dict[str, Any], cells: dict[str, Any],
            load_start: tuple[float, float, float]) -> None:
    rows = rows_for(cells)
    print(table(rows, HEADER))
    path = write_result(name, {**info, "load_average": {"start": load_start,
                                                        "end": os.getloadavg()},
                               "cells": cells,
                               "best": best_cell(cells, info.get("built"), info.get("files")),
                               "table": {"header": HEADER, "rows": rows}})
    print(f"wrote {path}", flush=True)


def _export(data: Path, env: str = "bfcl") -> None:
    data.mkdir(parents=True, exist_ok=True)
    for f, cmd in exports(env).items():
        if not (data / f).is_file():
            argv = shlex.split(cmd)
            subprocess.run([sys.executable, "-m", "envace.cli", *argv[1:-1], str(data / f)],
                           check=True, capture_output=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cell", action="append", required=True, metavar="LABEL=PROBE-ARGS",
                    help="a label and the `envace probe` arguments of one world model")
    ap.add_argument("--limit", type=int, default=0, help="at most this many dev trajectories")
    ap.add_argument("--name", default="world_model_skill")
    ap.add_argument("--env", choices=ENVS, default="bfcl",
                    help="the real environment whose train and dev splits are exported and "
                    "probed (agentdojo: write to another --name and --keep)")
    ap.add_argument("--keep", required=True, help="audits and the exported splits go here")
    ap.add_argument("--built", action="append", default=[], metavar="PATH=COMMAND",
                    help="how a model folder named by a cell was made (recorded, not run)")
    ap.add_argument("--collect", action="store_true",
                    help="no probing: read the audits already kept under --keep")
    ap.add_argument("--merge", action="store_true",
                    help="keep the cells (and --built commands) of bench/results/<name>.json: "
                    "a cell probed now replaces the one of its label, the others stay as "
                    "measured; the recorded command then probes them all")
    args = ap.parse_args(argv)
    try:
        cells_in = [parse_cell(c) for c in args.cell]
        built = dict(parse_built(b) for b in args.built)
    except ValueError as e:
        ap.error(str(e))
    keep = Path(args.keep)
    data = keep / "data"
    cells: dict[str, Any] = {}
    if args.merge:
        try:
            cells, old_built = previous_cells(machine.RESULTS / f"{args.name}.json")
        except ValueError as e:
            ap.error(str(e))
        built = {**old_built, **built}  # a cell probed again is replaced where it stands, once
        # its new audit is read: one that fails keeps its earlier figures
    command = command_for({**{label: c["probe_args"] for label, c in cells.items()},
                           **dict(cells_in)}, built, args.limit, args.env, args.name,
                          args.keep) if args.merge else \
        "python -m experiments.world_model_skill " + " ".join(
            shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    info = {"env": args.env, "split": "dev", "reference": "train",
            "decoding": "greedy, teacher-forced", "threads": 1, "limit": args.limit or None,
            "command": command, "scorer": "exact", "files": exports(args.env), "built": built}
    load_start = os.getloadavg()
    if not args.collect:
        _export(data, args.env)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    failed = 0
    for label, probe_args in cells_in:
        out = keep / dirname(label)
        if not args.collect:
            real_args = [str(data / a) if a in EXPORT else a for a in probe_args]
            cmd = [sys.executable, "-m", "envace.cli", "probe", *real_args,
                   str(data / "dev.jsonl"), "--reference", str(data / TRAIN),
                   "--out", str(out), "--quiet"]
            if args.limit:
                cmd += ["--limit", str(args.limit)]
            t0 = time.perf_counter()
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{label}: probe failed ({r.returncode}): {r.stderr.strip()[-500:]}",
                      file=sys.stderr)
                failed += 1
                continue
            print(f"{label}: {time.perf_counter() - t0:.0f} s", flush=True)
        if not (out / AUDIT.summary).is_file():
            continue
        summary = json.loads((out / AUDIT.summary).read_text())
        made = model_made(probe_args)
        if (warning := short_build_warning(made)) is not None:
            print(f"{label}: {warning}", file=sys.stderr)
        cells[label] = {**cell_result(summary), "probe_args": probe_args, "audit": str(out),
                        "load_average_after": os.getloadavg(),
                        **({"model_made": made} if made else {})}
        _report(args.name, info, cells, load_start)  # after every cell: nothing lost
    if not cells:
        print("no cell was probed", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
