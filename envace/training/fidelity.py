"""Fidelity of a batch of rollouts, for the trainer's log: audit each trajectory once, summarise.

    audits = replay_rollouts(trajs, settings)             # one replay per trajectory
    rows, per_traj = rehearsed_fidelity(audits, "exact")  # metrics, grounded_lambda's reward
    write_step_audit(RUN.step_audit(run_dir, 3), trajs, audits, settings, rollout_file)

The verifier already executes the committed calls in the real environment, so pairing each
rehearsed response with the real one costs one replay per trajectory, and a step replays its
rollouts once: the records that give the metrics are the ones written to ``audit/step_<N>/``
(through ``audit.store.output.AuditWriter``, like every audit) once the rollouts have their ids,
rewards and meta. Figures here cover the *rehearsed* steps only (per-turn tasks carry earlier
turns as real context; those are checked for determinism in the step's audit directory but not
counted as fidelity). Depth counts from the policy's first rehearsed call. These are the audit's
own figures (``audit.stats.population`` picks the steps for both), so ``fidelity/divergence_rate``,
``fidelity/<scorer>`` and ``fidelity/depth_<d>`` (d < max_depth) equal ``divergence_rate``, the
scorer means and ``by_depth`` of the step's ``audit/step_<N>/summary.json``;
``fidelity/depth_<max_depth>`` pools the deeper steps.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from audit.replay import ReplayError, TrajectoryAudit, replay_trajectory, trajectory_row
from audit.scoring.settings import AuditOptions
from audit.stats.population import is_rehearsed
from audit.stats.summary import build_summary, compact
from audit.store.models import skipped_row
from audit.store.output import AuditWriter
from envace.core.envs.guard import GuardedEnv
from envace.core.schema import Trajectory

#: One trajectory's audit, or why it could not be replayed.
Audited = TrajectoryAudit | str


def replay_rollouts(trajs: list[Trajectory], settings: AuditOptions) -> list[Audited]:
    """Replay and score every trajectory once (a ``ReplayError`` becomes its reason)."""
    envs: dict = {}  # each under the call limits (a child process: envace.core.envs.guard)
    out: list[Audited] = []
    try:
        for traj in trajs:
            try:
                out.append(replay_trajectory(traj, settings, envs))
            except ReplayError as exc:
                out.append(str(exc))
    finally:
        for env in envs.values():
            if isinstance(env, GuardedEnv):  # a plain environment's "close" may be a tool
                env.close()
    return out


def rehearsed_fidelity(audits: list[Audited], verdict: str) -> tuple[list[dict], list[float]]:
    """(rehearsed answered step records, each with ``depth``; per-trajectory mean of the
    ``verdict`` scorer over them, NaN when a trajectory rehearsed nothing or was not replayed)."""
    rows: list[dict] = []
    per_traj: list[float] = []
    for res in audits:
        if isinstance(res, str):
            per_traj.append(float("nan"))
            continue
        mine = [r for r in res.steps if is_rehearsed(r) and not r["unanswered"]]
        rows.extend(mine)  # depth: set by the replay (audit.stats.population)
        per_traj.append(sum(r["scores"][verdict] for r in mine) / len(mine) if mine
                        else float("nan"))
    return rows, per_traj


def write_step_audit(out_dir: Path, trajs: list[Trajectory], audits: list[Audited],
                     settings: AuditOptions, source_file: str = "") -> dict[str, Any]:
    """Write the audit directory of ``trajs`` from their replays (no environment runs here).

    ``trajs`` may have changed since the replay (ids, rewards, meta set by the trainer): step
    records take the trajectory's current id, and its ``trajectories.jsonl`` row is rebuilt.
    Returns the summary as written."""
    rows, skipped = [], []
    with AuditWriter(out_dir, [source_file] if source_file else []) as w:
        for i, (traj, res) in enumerate(zip(trajs, audits, strict=True)):
            if isinstance(res, str):
                skipped.append(skipped_row(source_file, i + 1, res))
                continue
            steps = [{**r, "trajectory_id": traj.id} for r in res.steps]
            w.write_steps(steps, {**trajectory_row(traj, steps), "file": source_file,
                                  "line": i + 1})
            rows.extend(compact(r) for r in steps)
        opts = AuditOptions(list(settings.scorers), settings.verdict_scorer,
                             settings.verdict_threshold, progress=False, plots=False)
        summary = build_summary(rows, opts, trajectories=len(trajs) - len(skipped),
                                read=len(trajs), skipped=skipped, warnings=[],
                                inputs=[source_file], seconds=0.0)
        return w.finish(summary, plots=False)


def audit_rollouts(trajs: list[Trajectory], scorers: list[str], verdict: str,
                   out_dir: Path | None, source_file: str = "") -> tuple[list[dict], list[float]]:
    """Replay and score every trajectory once; write an audit directory when ``out_dir`` is
    given. Returns :func:`rehearsed_fidelity`'s (rows, per-trajectory fidelity)."""
    settings = AuditOptions(list(scorers), verdict)
    audits = replay_rollouts(trajs, settings)
    if out_dir is not None:
        write_step_audit(out_dir, trajs, audits, settings, source_file)
    return rehearsed_fidelity(audits, verdict)


def fidelity_metrics(rows: list[dict], scorers: list[str], max_depth: int = 8) -> dict[str, Any]:
    """Flat ``fidelity/...`` metrics: divergence rate, mean scores, divergence by depth.

    ``rows``: the rehearsed step records :func:`rehearsed_fidelity` returns (each with
    ``depth``).
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
