"""Fidelity of a batch of rollouts, for the trainer's log: audit each trajectory, summarise.

The verifier already executes the committed calls in the real environment, so pairing each
rehearsed response with the real one costs one replay per trajectory. Figures here cover the
*rehearsed* steps only (per-turn tasks carry earlier turns as real context; those are checked
for determinism in the step's audit directory but not counted as fidelity). Depth counts from
the policy's first rehearsed call. These are the audit's own figures (``audit.population`` picks
the steps for both), so ``fidelity/divergence_rate``, ``fidelity/<scorer>`` and
``fidelity/depth_<d>`` (d < max_depth) equal ``divergence_rate``, the scorer means and
``by_depth`` of the step's ``audit/step_<N>/summary.json``; ``fidelity/depth_<max_depth>`` pools
the deeper steps.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from audit.pipeline import AuditOptions, _Writer, write_json_atomic
from audit.population import is_rehearsed
from audit.replay import AuditSettings, ReplayError, replay_trajectory
from audit.report import write_report
from audit.summary import build_summary, compact
from envace.core.schema import Trajectory


def audit_rollouts(trajs: list[Trajectory], scorers: list[str], verdict: str,
                   out_dir: Path | None, source_file: str = "") -> tuple[list[dict], list[float]]:
    """Replay and score every trajectory; write an audit directory when ``out_dir`` is given.

    Returns (rehearsed step records with ``depth`` added, per-trajectory exact-match fidelity or
    NaN when a trajectory rehearsed nothing).
    """
    settings = AuditSettings(list(scorers), verdict)
    envs: dict = {}
    rehearsed_rows: list[dict] = []
    per_traj: list[float] = []
    rows, skipped = [], []
    writers = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        writers = (_Writer(out_dir / "steps.jsonl"), _Writer(out_dir / "trajectories.jsonl"))
    for i, traj in enumerate(trajs):
        try:
            res = replay_trajectory(traj, settings, envs)
        except ReplayError as exc:
            skipped.append({"file": source_file, "line": i + 1, "reason": str(exc)})
            per_traj.append(float("nan"))
            continue
        mine = [r for r in res.steps if is_rehearsed(r) and not r["unanswered"]]
        rehearsed_rows.extend(mine)  # depth: set by the replay (audit.population)
        per_traj.append(sum(r["scores"][verdict] for r in mine) / len(mine) if mine
                        else float("nan"))
        if writers:
            for r in res.steps:
                writers[0].write(r)
                rows.append(compact(r))
            writers[1].write({**res.summary, "file": source_file, "line": i + 1})
    if writers and out_dir is not None:
        writers[0].finish()
        writers[1].finish()
        opts = AuditOptions(scorers=list(scorers), verdict_scorer=verdict, progress=False,
                            plots=False)
        summary = build_summary(rows, opts, trajectories=len(trajs) - len(skipped),
                                read=len(trajs), skipped=skipped, warnings=[],
                                inputs=[source_file], seconds=0.0)
        write_json_atomic(out_dir / "summary.json", summary)
        write_report(out_dir, summary, plots=False)
    return rehearsed_rows, per_traj


def fidelity_metrics(rows: list[dict], scorers: list[str], max_depth: int = 8) -> dict[str, Any]:
    """Flat ``fidelity/...`` metrics: divergence rate, mean scores, divergence by depth.

    ``rows``: the rehearsed step records ``audit_rollouts`` returns (each with ``depth``).
    """
    out: dict[str, Any] = {"fidelity/steps": len(rows)}
    if not rows:
        return out
    out["fidelity/divergence_rate"] = sum(bool(r["diverged"]) for r in rows) / len(rows)
    for s in scorers:
        out[f"fidelity/{s}"] = sum(r["scores"][s] for r in rows) / len(rows)
    by_depth: dict[int, list[bool]] = defaultdict(list)
    for r in rows:
        by_depth[min(r["depth"], max_depth)].append(bool(r["diverged"]))
    for d, v in sorted(by_depth.items()):
        out[f"fidelity/depth_{d}"] = sum(v) / len(v)
    actual_err = [r for r in rows if r["actual_error"]]
    if actual_err:
        out["fidelity/error_recall"] = sum(bool(r["rehearsed_error"]) for r in actual_err) / len(
            actual_err)
    return out
