"""Stream trajectory files through replay and write an audit directory.

    from audit.pipeline import run_audit
    summary = run_audit(["rollouts.jsonl"], "audit_out", AuditOptions(workers=2))

Writes (docs/spec/trajectory.md, "Audit output"): ``steps.jsonl`` (one line per tool call),
``trajectories.jsonl`` (one line per trajectory), ``summary.json`` and ``report.md`` with PNG
plots. Input is streamed: at most a bounded window of trajectories is in flight, and only a
compact row per step (no texts) is kept for the statistics. A record that cannot be read or
replayed is reported with its file and line number and skipped; read = audited + skipped.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit.replay import AuditSettings, Override, ReplayError, replay_trajectory
from audit.summary import build_summary, compact
from envace.schema import Trajectory, read_trajectories


@dataclass
class AuditOptions:
    """Options of an audit run (the CLI's flags)."""

    scorers: list[str] = field(default_factory=lambda: ["exact", "json_f1", "fuzzy",
                                                        "error_agreement"])
    verdict_scorer: str = "exact"
    verdict_threshold: float = 1.0
    workers: int = 1
    reference: str | None = None  # a training trajectory file for reference world models
    override: str | None = None  # audit a reference alone: its name
    progress: bool = True
    plots: bool = True


_WORKER: dict[str, Any] = {}


def reference_triples(path: str | os.PathLike[str]) -> list[tuple[str, dict, str]]:
    """(tool, arguments, real response) of every answered, well-formed call in a file."""
    out = []
    for item in read_trajectories(path):
        if item.trajectory is None:
            continue
        for st in item.trajectory.tool_steps():
            if st.arguments is not None and st.response is not None and not st.response.rehearsed:
                out.append((st.tool, st.arguments, st.response.content or ""))
    return out


def _init_worker(opts: AuditOptions, triples: list[tuple[str, dict, str]] | None) -> None:
    from audit.reference import REFERENCE_NAMES, build_reference

    refs: dict[str, Override] = {}
    if triples is not None:
        refs = {n: build_reference(n, triples) for n in REFERENCE_NAMES}
    override = refs.get(opts.override) if opts.override else None
    _WORKER.update(
        settings=AuditSettings(list(opts.scorers), opts.verdict_scorer, opts.verdict_threshold,
                               references={} if override else refs),
        override=override,
        envs={},
    )


def _work(job: tuple[str, int, str]) -> tuple[str, int, Any]:
    path, line, text = job
    try:
        traj = Trajectory.model_validate_json(text)
        result = replay_trajectory(traj, _WORKER["settings"], _WORKER["envs"], _WORKER["override"])
        return path, line, result
    except ReplayError as exc:
        return path, line, f"cannot replay: {exc}"
    except Exception as exc:  # a bug or a hostile record must not stop the audit
        return path, line, f"replay failed: {type(exc).__name__}: {exc}"


def _jobs(paths: Iterable[str], skipped: list[dict], counts: dict[str, int]
          ) -> Iterator[tuple[str, int, str]]:
    for p in paths:
        if not Path(p).exists():
            skipped.append({"file": str(p), "line": None, "reason": "file not found"})
            continue
        for item in read_trajectories(p):
            counts["read"] += 1
            if item.trajectory is None:
                skipped.append({"file": item.path, "line": item.line, "reason": item.error})
                continue
            yield item.path, item.line, item.trajectory.model_dump_json(by_alias=True)


class _Writer:
    def __init__(self, path: Path) -> None:
        self.tmp = path.with_suffix(path.suffix + ".partial")
        self.path = path
        self.fh = open(self.tmp, "w", encoding="utf-8")  # noqa: SIM115 (closed in finish)

    def write(self, obj: dict) -> None:
        self.fh.write(json.dumps(obj, ensure_ascii=False) + "\n")

    def finish(self) -> None:
        self.fh.close()
        os.replace(self.tmp, self.path)


def run_audit(inputs: list[str], out_dir: str | os.PathLike[str],
              opts: AuditOptions | None = None) -> dict[str, Any]:
    """Replay, score and summarise; write the audit directory; return the summary."""
    opts = opts or AuditOptions()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    triples = reference_triples(opts.reference) if opts.reference else None
    if opts.override and triples is None:
        raise ValueError("auditing a reference needs --reference TRAIN.jsonl")
    AuditSettings(list(opts.scorers), opts.verdict_scorer, opts.verdict_threshold)  # validate
    _init_worker(opts, triples)
    skipped: list[dict] = []
    warnings: list[dict] = []
    counts = {"read": 0}
    rows: list[dict] = []
    trajectories = 0
    t0 = time.perf_counter()
    steps_w, traj_w = _Writer(out / "steps.jsonl"), _Writer(out / "trajectories.jsonl")
    bar = _progress(opts.progress)
    fn = _work
    jobs = _jobs(inputs, skipped, counts)
    if opts.workers > 1:
        results = _ordered_map_init(fn, jobs, opts, triples)
    else:
        results = map(fn, jobs)
    for path, line, res in results:
        if isinstance(res, str):
            skipped.append({"file": path, "line": line, "reason": res})
            continue
        trajectories += 1
        for w in res.warnings:
            warnings.append({"file": path, "line": line,
                             "trajectory_id": res.summary["trajectory_id"], "message": w})
        for rec in res.steps:
            steps_w.write(rec)
            rows.append(compact(rec))
        traj_w.write({**res.summary, "file": path, "line": line})
        bar.update(len(res.steps))
    bar.close()
    steps_w.finish()
    traj_w.finish()
    summary = build_summary(rows, opts, trajectories=trajectories, read=counts["read"],
                            skipped=skipped, warnings=warnings, inputs=inputs,
                            seconds=time.perf_counter() - t0)
    write_json_atomic(out / "summary.json", summary)
    from audit.report import write_report

    write_report(out, summary, plots=opts.plots)
    return summary


def _ordered_map_init(fn: Callable, jobs: Iterator, opts: AuditOptions,
                      triples: list | None) -> Iterator:
    with ProcessPoolExecutor(opts.workers, initializer=_init_worker,
                             initargs=(opts, triples)) as pool:
        pending: deque[Future] = deque()
        window = 8 * opts.workers
        for job in jobs:
            pending.append(pool.submit(fn, job))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(desc="audit", unit="step", file=sys.stderr, leave=False)
