"""Rescore a stored audit with other scorers or another verdict: no replay, no environment.

Each step record already holds the rehearsed and the actual response and the context a scorer
may use (tool, arguments, step, read/write, error flags), so new scores, verdicts, the summary and
the report are recomputed from ``steps.jsonl`` alone. Reference responses stored with the steps
are rescored too. Files written before step records carried ``depth`` get it here (derived per
trajectory from the order of its calls and the ``source_rehearsed`` flags).

``summary_from_steps`` recomputes a summary without rewriting anything (the dashboard uses it for
audits whose ``summary.json`` predates the current statistics).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from audit.pipeline import AuditOptions, _Writer, write_json_atomic
from audit.population import assign_depths
from audit.replay import AuditSettings
from audit.scorers import ScoreContext, score_step
from audit.summary import SUMMARY_VERSION, build_summary, compact


def rescore_record(rec: dict[str, Any], settings: AuditSettings) -> dict[str, Any]:
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


def rescore(src: Path, out: Path, opts: AuditOptions) -> dict[str, Any]:
    """Rescore ``src/steps.jsonl`` into ``out`` (may be ``src``); return the new summary."""
    settings = AuditSettings(list(opts.scorers), opts.verdict_scorer, opts.verdict_threshold)
    old = json.loads((src / "summary.json").read_text()) if (src / "summary.json").exists() else {}
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    bad: list[dict] = []
    writer = _Writer(out / "steps.jsonl")
    pending: list[dict] = []  # one trajectory's records (they are contiguous in steps.jsonl)

    def flush() -> None:
        if pending and not all("depth" in r for r in pending):
            assign_depths(pending)
        for r in pending:
            writer.write(r)
            rows.append(compact(r))
        pending.clear()

    with open(src / "steps.jsonl", encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                bad.append({"file": str(src / "steps.jsonl"), "line": n,
                            "reason": f"invalid JSON: {exc.msg}"})
                continue
            new = rescore_record(rec, settings)
            if pending and pending[-1].get("trajectory_id") != new.get("trajectory_id"):
                flush()
            pending.append(new)
    flush()
    writer.finish()
    if out != src and (src / "trajectories.jsonl").exists():
        (out / "trajectories.jsonl").write_text((src / "trajectories.jsonl").read_text())
    opts.reference = old.get("reference_file")
    counts = old.get("counts", {})
    summary = build_summary(
        rows, opts,
        trajectories=counts.get("trajectories", len({r["trajectory_id"] for r in rows})),
        read=counts.get("records_read", 0), skipped=old.get("skipped_records", []) + bad,
        warnings=old.get("warnings", []), inputs=old.get("inputs", [str(src)]), seconds=0.0)
    summary["rescored_from"] = str(src)
    write_json_atomic(out / "summary.json", summary)
    from audit.report import write_report

    write_report(out, summary, plots=opts.plots)
    return summary


def summary_from_steps(audit_dir: str | Path, logistic_boot: int = 0) -> dict[str, Any]:
    """The current summary of an audit directory from its ``steps.jsonl``, scores as stored.

    Nothing is written. Counts, inputs, verdict and skipped records come from the old
    ``summary.json`` when there is one; ``logistic_boot`` = 0 leaves the odds-ratio interval out
    (its many fits are the slow part). ``recomputed_from`` says where the figures came from.
    """
    src = Path(audit_dir)
    old = json.loads((src / "summary.json").read_text()) if (src / "summary.json").exists() else {}
    rows = []
    with open(src / "steps.jsonl", encoding="utf-8") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a truncated last line: counted by the readers that show it
            if isinstance(rec, dict) and "trajectory_id" in rec:
                rows.append(compact(rec))
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
    summary["recomputed_from"] = {"steps": str(src / "steps.jsonl"),
                                  "old_schema": old.get("schema"), "schema": SUMMARY_VERSION,
                                  "logistic_boot": logistic_boot}
    return summary
