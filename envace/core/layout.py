"""Every file name of a run directory and of an audit directory, defined once.

    from envace.core.layout import AUDIT, RUN
    steps = audit_dir / AUDIT.steps                # "steps.jsonl"
    audit_dir = RUN.step_audit(run_dir, 3)         # run_dir / "audit" / "step_3"

The names are a contract (docs/spec/run_dir.md, docs/spec/trajectory.md "Audit output"): the
trainer, ``envace-audit``, the evaluation commands and the dashboard all spell them through
this module. Torch-free and imports nothing from envace.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class AuditLayout:
    """The files of an audit directory (``envace-audit replay/probe/rescore``, the trainer's
    ``audit/step_<N>/``) and of a ``compare`` output."""

    steps: str = "steps.jsonl"  #: one line per tool call (audit.models.StepRow)
    trajectories: str = "trajectories.jsonl"  #: one line per audited trajectory
    summary: str = "summary.json"  #: audit.models.AuditSummary
    report: str = "report.md"  #: for a person, plots beside it
    depth_plot: str = "depth.png"
    survival_plot: str = "survival.png"
    tools_plot: str = "tools.png"
    history_plot: str = "history.png"  #: real vs own history by depth (probe --history both)
    unreadable: str = "steps.unreadable.jsonl"  #: lines rescore could not use, verbatim
    compare_json: str = "compare.json"
    compare_md: str = "compare.md"

    @property
    def plots(self) -> tuple[str, ...]:
        """The PNG plots ``report.md`` shows, in the order it shows them."""
        return (self.depth_plot, self.survival_plot, self.tools_plot, self.history_plot)

    @property
    def files(self) -> frozenset[str]:
        """Every file a complete audit directory may hold."""
        return frozenset({self.steps, self.trajectories, self.summary, self.report,
                          *self.plots, self.unreadable})

    @property
    def markers(self) -> tuple[str, ...]:
        """Files whose presence makes a directory an audit (the dashboard's test)."""
        return (self.summary, self.steps)


@dataclass(frozen=True)
class RunLayout:
    """The files and folders of a training run directory (docs/spec/run_dir.md)."""

    config: str = "config.yaml"
    metrics: str = "metrics.jsonl"
    report: str = "report.md"
    rollouts: str = "rollouts"
    audit: str = "audit"
    eval: str = "eval"
    checkpoints: str = "checkpoints"
    running: str = "RUNNING"
    heartbeat: str = "heartbeat"
    eval_trajectories: str = "trajectories.jsonl"  #: eval/<name>/ (envace eval, rehearse)
    eval_summary: str = "summary.json"
    plans: str = "plans.jsonl"

    def rollout_file(self, run_dir: Path, step: int) -> Path:
        """``rollouts/step_<N>.jsonl``: the trajectories of step N."""
        return Path(run_dir) / self.rollouts / f"step_{step}.jsonl"

    def step_audit(self, run_dir: Path, step: int) -> Path:
        """``audit/step_<N>/``: the audit directory of step N's rollouts."""
        return Path(run_dir) / self.audit / f"step_{step}"

    def eval_dir(self, run_dir: Path, name: str) -> Path:
        """``eval/<name>/``: one evaluation's trajectories and summary."""
        return Path(run_dir) / self.eval / name


AUDIT = AuditLayout()
RUN = RunLayout()
