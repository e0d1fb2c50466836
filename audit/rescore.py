"""Rescore a stored audit with other scorers or another verdict: no replay, no environment.

Each step record already holds the rehearsed and the actual response and the context a scorer
may use (tool, arguments, step, read/write, error flags), so new scores, verdicts, the summary and
the report are recomputed from ``steps.jsonl`` alone. Reference responses stored with the steps
are rescored too. Files written before step records carried ``depth`` get it here (derived per
trajectory from the order of its calls and the ``source_rehearsed`` flags).

A new audit directory is written (``audit.store.output``: in place of the old one or at ``--out``,
renamed in when complete). Nothing is dropped: a line of ``steps.jsonl`` that cannot be read,
validated or scored is listed in ``skipped_records`` (file, line, reason) and kept verbatim in
``steps.unreadable.jsonl`` of the new audit (an old ``steps.unreadable.jsonl`` is carried over);
``trajectories.jsonl`` is copied as it is. A damaged ``summary.json`` is reported the same way and
its counts recomputed from the steps. A ``steps.jsonl`` with lines but none usable is refused
(:class:`envace.core.errors.UsageError`, nothing written).

``summary_from_steps`` recomputes a summary without rewriting anything (the dashboard uses it for
audits whose ``summary.json`` predates the current statistics).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from audit.scoring.scorers import ScoreContext, score_step
from audit.scoring.settings import AuditOptions
from audit.stats.population import assign_depths
from audit.stats.summary import build_summary, compact
from audit.store.models import SUMMARY_VERSION, place, skipped_row
from audit.store.output import AuditWriter
from audit.store.records import read_steps, read_summary
from audit.store.step_rows import step_line
from envace.core.errors import UsageError
from envace.core.layout import AUDIT
from envace.core.schema import json_text

UNREADABLE = AUDIT.unreadable


def rescore_record(rec: dict[str, Any], settings: AuditOptions) -> dict[str, Any]:
    if rec.get("unanswered") or rec.get("rehearsed") is None:
        return {**rec, "scores": {}, "diverged": True}
    args = rec["arguments"] if isinstance(rec.get("arguments"), dict) else {}
    ctx = ScoreContext(tool=rec["tool"], arguments=args, step=rec["step"],
                       mutates_state=rec.get("mutates_state"),
                       actual_error=rec.get("actual_error"),
                       rehearsed_error=rec.get("rehearsed_error"))
    out = dict(rec)
    out["scores"] = score_step(rec["rehearsed"], rec["actual"], ctx, settings.scorers)
    out["diverged"] = settings.verdict(out["scores"])
    if rec.get("references"):
        out["references"] = {
            n: {"response": r["response"],
                "scores": score_step(r["response"], rec["actual"], ctx, settings.scorers)}
            for n, r in rec["references"].items()}
    return out


#: summary fields describing what was audited (a probe's model, its histories, a served
#: model's endpoint block, a grounded world model): a rescore keeps them as they were
KEPT = ("audited_model", "probe", "histories", "endpoint", "world_model", "reference_counts")


def rescore(src: Path, out: Path, opts: AuditOptions) -> dict[str, Any]:
    """Rescore ``src/steps.jsonl`` into ``out`` (may be ``src``); return the new summary."""
    settings = opts
    src, out = Path(src), Path(out)
    in_place = os.path.realpath(src) == os.path.realpath(out)
    with AuditWriter(out, [src], replaces=src if in_place else None, trajectories=False) as w:
        try:
            steps = read_steps(src)
        except OSError as exc:
            raise UsageError(f"cannot read {src / AUDIT.steps}: {exc.strerror or exc}"
                             ) from None
        if steps.unusable:
            raise UsageError(f"no usable step record ({steps.nonblank} lines; "
                             f"{place(steps.skipped[0])}: {steps.skipped[0]['reason']})")
        old, problems = read_summary(src)
        bad = list(steps.skipped)
        raw_bad = list(steps.bad)
        rows: list[dict] = []
        pending: list[dict] = []  # one trajectory's records (contiguous in steps.jsonl)

        def flush() -> None:
            if pending and not all("depth" in r for r in pending):
                assign_depths(pending)
            w.write_lines("".join(step_line(r) for r in pending))
            rows.extend(compact(r) for r in pending)
            pending.clear()

        for rec, line in zip(steps.records, steps.lines, strict=True):
            try:
                new = rescore_record(rec, settings)
                step_line(new).encode("utf-8")  # a step row, writable (no lone surrogate
                # from a \\ud800 escape), or kept verbatim below
            except Exception as exc:  # one bad record costs one record
                bad.append(skipped_row(steps.path, line,
                                       f"cannot rescore: {type(exc).__name__}: {exc}"[:300]))
                raw_bad.append((json_text(rec) + "\n").encode())
                continue
            if pending and pending[-1]["trajectory_id"] != new["trajectory_id"]:
                flush()
            pending.append(new)
        flush()
        _keep_unreadable(src / UNREADABLE, w.path(UNREADABLE), raw_bad, bad)
        if (src / AUDIT.trajectories).is_file():
            w.copy_trajectories(src / AUDIT.trajectories)
        opts.reference = old.get("reference_file")
        if opts.cluster_by is None and isinstance(old.get("resampling_unit"), str):
            opts.cluster_by = old["resampling_unit"]  # rescoring keeps what was resampled
        counts = old.get("counts", {})
        n_traj = counts.get("trajectories", len({r["trajectory_id"] for r in rows}))
        summary = build_summary(
            rows, opts, trajectories=n_traj, read=counts.get("records_read", n_traj),
            skipped=old.get("skipped_records", []) + problems + bad,
            warnings=old.get("warnings", []), inputs=old.get("inputs", [str(src)]),
            seconds=0.0)
        if old.get("reference_skipped_records"):
            summary["reference_skipped_records"] = old["reference_skipped_records"]
        for key in KEPT:  # what was audited and how: rescoring changes neither
            if old.get(key) is not None:
                summary[key] = old[key]
        summary["rescored_from"] = str(src)
        return w.finish(summary, plots=opts.plots)


def _keep_unreadable(old: Path, new: Path, raw: list[bytes], bad: list[dict]) -> None:
    """Carry the old unreadable lines over and add this run's, verbatim; say where each is."""
    if not raw and not old.is_file():
        return
    with open(new, "wb") as fh:
        n = 0
        if old.is_file():
            with open(old, "rb") as prev:
                for chunk in prev:
                    fh.write(chunk)
                    n += 1
        for entry, line in zip(bad, raw, strict=True):
            fh.write(line)
            n += 1
            entry["kept_in"] = f"{UNREADABLE}:{n}"


def summary_from_steps(audit_dir: str | Path, logistic_boot: int = 0) -> dict[str, Any]:
    """The current summary of an audit directory from its ``steps.jsonl``, scores as stored.

    Nothing is written. Counts, inputs, verdict and skipped records come from the old
    ``summary.json`` when there is one; ``logistic_boot`` = 0 leaves the odds-ratio interval out
    (its many fits are the slow part). ``recomputed_from`` says where the figures came from.
    """
    src = Path(audit_dir)
    old, _problems = read_summary(src)
    rows = [compact(rec) for rec in read_steps(src).records]  # bad lines: rescore reports them
    verdict = old.get("verdict") or {}
    opts = AuditOptions(scorers=list(old.get("scorers") or sorted(
                            {k for r in rows for k in (r.get("scores") or {})})),
                        verdict_scorer=verdict.get("scorer", "exact"),
                        verdict_threshold=verdict.get("threshold", 1.0),
                        reference=old.get("reference_file"), progress=False, plots=False)
    counts = old.get("counts", {})
    n_traj = counts.get("trajectories", len({r["trajectory_id"] for r in rows}))
    summary = build_summary(
        rows, opts, trajectories=n_traj, read=counts.get("records_read", 0),
        skipped=old.get("skipped_records", []), warnings=old.get("warnings", []),
        inputs=old.get("inputs", [str(src)]), seconds=0.0, logistic_boot=logistic_boot)
    for key in ("audited_model", "probe", "rescored_from"):
        if old.get(key) is not None:
            summary[key] = old[key]
    summary["recomputed_from"] = {"steps": str(src / AUDIT.steps),
                                  "old_schema": old.get("schema"), "schema": SUMMARY_VERSION,
                                  "logistic_boot": logistic_boot}
    return summary
