"""What an audit scores and how: one settings object for replay, probe, rescore and the trainer.

    opts = AuditOptions(scorers=["exact", "json_f1"], verdict_scorer="json_f1",
                        verdict_threshold=0.9, workers=2)
    opts.verdict({"exact": 0.0, "json_f1": 0.95})   # False: not diverged

The verdict scorer is always scored: it is appended to ``scorers`` when
missing. ``references`` are reference world models built in the process that replays
(functions: a worker process builds its own); ``reference`` is the training file they come
from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from audit.scoring.scorers import DEFAULT_SCORERS, Verdict, make_verdict
from envace.core.envs.limits import DEFAULT_CALL_TIMEOUT_S, DEFAULT_MEMORY_MB, CallLimits

#: An alternative writer of the "rehearsed" side, e.g. a reference world model:
#: (tool, arguments) -> response text.
Override = Callable[[str, dict[str, Any]], str]


@dataclass
class AuditOptions:
    """Options of an audit (the CLI's flags) and the scoring rule they make."""

    scorers: list[str] = field(default_factory=lambda: list(DEFAULT_SCORERS))
    verdict_scorer: str = "exact"
    verdict_threshold: float = 1.0
    references: Mapping[str, Override] = field(default_factory=dict)
    workers: int = 1
    reference: str | None = None  # a training trajectory file for reference world models
    override: str | None = None  # audit a reference alone: its name
    progress: bool = True
    plots: bool = True
    #: what intervals resample: trajectory, task, scenario or a step-row field; None: the
    #: environment family's declared unit (envace.core.envs.units)
    cluster_by: str | None = None
    #: every real environment call's wall-clock limit (s) and added memory (MiB), None: off
    #: (``envace.core.envs.guard``: the environment runs in a child process that is killed)
    call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S
    call_memory_mb: int | None = DEFAULT_MEMORY_MB
    #: audit only shard (I, N) of the input (``audit.shard``; None: all of it)
    shard: tuple[int, int] | None = None
    #: record how every call changed the real state (``state_change`` of a step row,
    #: ``envace.core.envs.statediff``: one ``state()`` per call)
    state_change: bool = True

    def __post_init__(self) -> None:
        self.scorers = list(self.scorers)
        if self.verdict_scorer not in self.scorers:
            self.scorers.append(self.verdict_scorer)

    @property
    def limits(self) -> CallLimits:
        """The limits every real environment call runs under."""
        return CallLimits(self.call_timeout_s, self.call_memory_mb)

    @property
    def verdict(self) -> Verdict:
        """The divergence rule (raises ``ValueError`` for an unknown scorer or a threshold
        outside [0, 1])."""
        return make_verdict(self.verdict_scorer, self.verdict_threshold)


