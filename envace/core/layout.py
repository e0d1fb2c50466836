"""Every file name of a run directory and of an audit directory, defined once.

    from envace.core.layout import AUDIT, RUN
    steps = audit_dir / AUDIT.steps                # "steps.jsonl"
    audit_dir = RUN.step_audit(run_dir, 3)         # run_dir / "audit" / "step_3"

The names are a contract (docs/spec/run_dir.md, docs/spec/trajectory.md "Audit output"): the
trainer, ``envace-audit``, the evaluation commands and the dashboard all spell them through
this module. Torch-free and imports nothing from envace.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path


@dataclass(frozen=True)
class AuditLayout:
    """The files of an audit directory (``envace-audit replay/probe/rescore``, the trainer's
    ``audit/step_<N>/``) and of a ``compare`` output."""

    steps: str = "steps.jsonl"  #: one line per tool call (audit.store.step_rows.StepRow)
    trajectories: str = "trajectories.jsonl"  #: one line per audited trajectory
    summary: str = "summary.json"  #: audit.store.models.AuditSummary
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

    config: str = "config.yaml"  #: the resolved configuration (every default filled in)
    metrics: str = "metrics.jsonl"  #: one row per optimizer step
    metrics_torn: str = "metrics.jsonl.truncated"  #: unparseable metrics lines (--resume)
    metrics_before_restart: str = "metrics.jsonl.before_restart"  #: rows kept by --restart
    report: str = "report.md"  #: the run's summary for a person; a finished run has it
    rollouts: str = "rollouts"  #: rollouts/step_<N>.jsonl
    audit: str = "audit"  #: audit/step_<N>/ (an audit directory); also eval/<name>/audit/
    eval: str = "eval"  #: eval/<name>/
    checkpoints: str = "checkpoints"  #: checkpoints/step_<N>/
    trainer_state: str = "trainer_state.json"  #: a checkpoint's step and info (its marker)
    trainer_tensors: str = "trainer_state.pt"  #: a checkpoint's optimizer, scheduler, RNG
    initial_model: str = "initial_model"  #: the policy's KL anchor (kl_coef > 0)
    initial_world_model: str = "initial_world_model"  #: a separate world model's KL anchor
    running: str = "RUNNING"  #: JSON {"pid", "host", "started"} while the run goes
    heartbeat: str = "heartbeat"  #: rewritten every 20 s by the live run
    lock: str = ".train.lock"  #: flock held by the one process writing the run
    eval_trajectories: str = "trajectories.jsonl"  #: eval/<name>/ (envace eval, rehearse)
    eval_summary: str = "summary.json"  #: eval/<name>/: the evaluation's figures
    plans: str = "plans.jsonl"  #: eval/<name>/ of test-time rehearsal: the rehearsed plans

    @property
    def markers(self) -> tuple[str, ...]:
        """Files and folders whose presence makes a directory a training run (the dashboard)."""
        return (self.config, self.metrics, self.report, self.rollouts, self.audit, self.eval,
                self.checkpoints, self.running)

    @property
    def files(self) -> frozenset[str]:
        """Every name this layout defines (docs/spec/run_dir.md lists each)."""
        return frozenset(getattr(self, f.name) for f in fields(self))

    def rollout_file(self, run_dir: Path, step: int) -> Path:
        """``rollouts/step_<N>.jsonl``: the trajectories of step N."""
        return Path(run_dir) / self.rollouts / f"step_{step}.jsonl"

    def checkpoint_dir(self, run_dir: Path, step: int) -> Path:
        """``checkpoints/step_<N>/``: the checkpoint written after step N."""
        return Path(run_dir) / self.checkpoints / f"step_{step}"

    def step_audit(self, run_dir: Path, step: int) -> Path:
        """``audit/step_<N>/``: the audit directory of step N's rollouts."""
        return Path(run_dir) / self.audit / f"step_{step}"

    def eval_dir(self, run_dir: Path, name: str) -> Path:
        """``eval/<name>/``: one evaluation's trajectories and summary."""
        return Path(run_dir) / self.eval / name


AUDIT = AuditLayout()
RUN = RunLayout()
