"""Typed, versioned records of an audit directory: a ``steps.jsonl`` row and ``summary.json``.

    row = StepRow.model_validate(record)          # raises pydantic.ValidationError
    line = step_line(record)                      # one checked steps.jsonl line
    summary, problems = read_summary_data(data)   # lenient: a bad field is dropped and named

The field names and values are those docs/spec/trajectory.md ("Audit output") specifies and
earlier versions wrote, in the same order, so a file written through these models reads as one
written before them (and an answered step's line is byte-for-byte the same). Step rows carry no
schema field of their own: the directory's ``summary.json`` (``"schema": "envace.audit/2"``)
versions both files. Types are strict (a bool is not a number, ``"3"`` is not a step); fields
the spec calls optional may be missing or null, so files of every earlier version read.
Unknown fields are kept as they are (a newer writer's, a plugin's).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    ValidationError,
    create_model,
    model_validator,
)

from envace.core.layout import AUDIT
from envace.core.schema import json_text

SUMMARY_VERSION = "envace.audit/2"  # /2: statistics over rehearsed steps, trajectory bootstrap
SCHEMA_PREFIX = "envace.audit/"

_STRICT = ConfigDict(strict=True, extra="allow")
Scores = dict[str, FiniteFloat]
Number = Annotated[int | FiniteFloat, Field()]


class ReferenceResponse(BaseModel):
    """What one reference world model answered for a step, scored against reality."""

    model_config = _STRICT
    response: str
    scores: Scores


class StateChangeRecord(BaseModel):
    """How a call changed the real state (``envace.core.envs.statediff``): the number of state
    leaves it changed and the first paths of them."""

    model_config = _STRICT
    leaves: int = Field(ge=0)
    paths: list[str] = Field(default_factory=list)


class StepRow(BaseModel):
    """One line of ``steps.jsonl``: a tool call, both responses, scores and the verdict."""

    model_config = _STRICT
    trajectory_id: str
    task_id: str
    env_name: str | None = None  #: the trajectory's ``env.name`` (what its unit is read from)
    #: index among all the trajectory's calls (a 64 MiB trajectory line holds < 2**20 of them)
    step: int = Field(ge=0, lt=2**20)
    tool: str
    arguments: Any = None  #: the parsed arguments, or the raw text of a malformed call
    rehearsed: str | None = None  #: the recorded response (None: unanswered)
    actual: str  #: the real environment's response
    actual_error: bool | None = None
    mutates_state: bool | None = None
    source_rehearsed: bool | None = None  #: the recorded message's ``rehearsed`` flag
    malformed: str | None = None  #: why the call could not be parsed
    unanswered: bool | None = None
    novelty: Number | None = None
    rehearsed_error: bool | None = None
    scores: Scores = Field(default_factory=dict)
    diverged: bool
    references: dict[str, ReferenceResponse] | None = None
    depth: int | None = Field(default=None, ge=0)  #: index among answered rehearsed calls
    probe: str | None = None  #: "teacher_forced" for ``envace probe``
    unanswered_reason: str | None = None
    #: the probe's history: "real" (teacher-forced) or "own" (self-conditioned, ``--history``)
    history: Literal["real", "own"] | None = None
    #: the real call ran past the call limit (or its process died) and was ended; written
    #: only when true
    timeout: bool | None = None
    #: how the real call changed the environment's state (null: not recorded, or the state
    #: could not be read); additive, issue 43
    state_change: StateChangeRecord | None = None

    @model_validator(mode="after")
    def _depth_within_step(self) -> StepRow:
        # depth counts answered rehearsed calls from the first one: never past the call's index
        # (a stored row that claims depth 10**6 would make every per-depth table that long)
        if self.depth is not None and self.depth > self.step:
            raise ValueError(f"depth {self.depth} is past the call's index {self.step}")
        return self

    def dump(self) -> dict[str, Any]:
        """The row as written: the fields it was given, in the spec's order."""
        return self.model_dump(exclude_unset=True)


#: Fields the statistics and the dashboard read (no texts): compact rows, steps_frame.
STAT_FIELDS = ("trajectory_id", "task_id", "step", "tool", "diverged", "scores", "mutates_state",
               "novelty", "unanswered", "source_rehearsed", "actual_error", "rehearsed_error",
               "depth", "malformed", "history", "state_change")

#: A step row without its texts (validated like StepRow, field for field).
StepStats: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "StepStats", __config__=ConfigDict(strict=True, extra="ignore"),
    **{k: (StepRow.model_fields[k].annotation, StepRow.model_fields[k]) for k in STAT_FIELDS})


def step_line(record: dict[str, Any]) -> str:
    """``record`` checked against :class:`StepRow` and serialised as one ``steps.jsonl`` line
    (with its newline). Raises ``pydantic.ValidationError`` or ``ValueError``."""
    return json_text(StepRow.model_validate(record).dump()) + "\n"


def problem(exc: ValidationError) -> str:
    """A one-line reason for the first error of a validation (for skipped records)."""
    err = exc.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(record)"
    if err["type"] == "missing":
        return f"missing field {loc!r}"
    got = type(err.get("input")).__name__
    return f"{loc} is {got}: {err['msg']}"[:300]


def step_problem(rec: Any) -> str | None:
    """Why a decoded ``steps.jsonl`` line is not a :class:`StepRow`, or None."""
    if not isinstance(rec, dict):
        return f"a step record must be a JSON object, got {type(rec).__name__}"
    try:
        StepRow.model_validate(rec)
    except ValidationError as exc:
        return problem(exc)
    except RecursionError:
        return "nested too deeply"
    return None


# ---------------------------------------------------------------- summary.json


class Skipped(BaseModel):
    """A record that was not audited: where it is and why (``line`` None: a whole file)."""

    model_config = _STRICT
    file: str
    line: int | None
    reason: str
    kept_in: str | None = None  #: ``steps.unreadable.jsonl:N`` where rescore kept its bytes

    def row(self) -> dict[str, Any]:
        """The entry of ``skipped_records`` (``kept_in`` only where rescore set it)."""
        return self.model_dump(exclude={"kept_in"} if self.kept_in is None else set())


def skipped_row(file: str | Any, line: int | None, reason: str) -> dict[str, Any]:
    """One ``skipped_records`` entry, checked against :class:`Skipped` (every place that skips a
    record writes it through here, so the shape has one definition)."""
    return Skipped(file=str(file), line=line, reason=str(reason)).row()


class Warning_(BaseModel):
    """A note about an audited record (non-finite numbers, unknown tools)."""

    model_config = _STRICT
    file: str
    line: int | None
    trajectory_id: Any
    message: str


class VerdictRule(BaseModel):
    """diverged = scores[scorer] < threshold."""

    model_config = _STRICT
    scorer: str
    threshold: FiniteFloat


class AuditSummary(BaseModel):
    """``summary.json`` of an audit (docs/spec/trajectory.md, "Audit output"), fields in the
    order they are written. Every field may be missing (an older or damaged file);
    statistics blocks are kept as written."""

    model_config = _STRICT
    schema_: str | None = Field(default=None, alias="schema")
    inputs: list[str] | None = None
    scorers: list[str] | None = None
    verdict: VerdictRule | None = None
    reference_file: str | None = None
    audited_model: str | None = None
    counts: dict[str, int] | None = None
    resampling_unit: str | None = None  #: what the intervals resample (audit.stats.clusters)
    resampling_unit_note: str | None = None  #: why the unit fell back to the task
    reconciles: bool | None = None
    skipped_records: list[Skipped] | None = None
    warnings: list[Warning_] | None = None
    statistics: dict[str, Any] | None = None
    determinism_check: bool | None = None
    determinism_warning: str | None = None
    by_source: dict[str, Any] | None = None
    error_prediction: dict[str, Any] | None = None
    divergence_rate: Number | None = None
    divergence_ci: list[Number | None] | None = None
    divergence_ci_method: str | None = None
    divergence_ci_mc_error: Number | None = None
    scores: dict[str, Any] | None = None
    by_depth: list[dict[str, Any]] | None = None
    by_tool: dict[str, Any] | None = None
    by_mutates_state: dict[str, Any] | None = None
    by_novelty: dict[str, Any] | None = None
    first_divergence: dict[str, Any] | None = None
    median_first_divergence: Any = None
    compounding: dict[str, Any] | None = None
    logistic: dict[str, Any] | None = None
    interval: dict[str, Any] | None = None
    skill: dict[str, Any] | None = None
    by_state_change: dict[str, Any] | None = None  #: fidelity by state leaves changed (issue 43)
    seconds: Number | None = None
    reference_counts: dict[str, int] | None = None
    reference_skipped_records: list[Skipped] | None = None
    probe: str | None = None
    histories: list[str] | None = None
    history: dict[str, Any] | None = None
    rescored_from: str | None = None
    recomputed_from: dict[str, Any] | None = None

    def dump(self) -> dict[str, Any]:
        """The summary as written: the fields it was given, in the spec's order."""
        return self.model_dump(by_alias=True, exclude_unset=True)

    @property
    def scored_steps(self) -> int | None:
        """How many steps the statistics count (``answered_steps`` in ``envace.audit/1``)."""
        c = self.counts or {}
        if self.schema_ == SUMMARY_VERSION or "scored_steps" in c:
            return c.get("scored_steps")
        return c.get("answered_steps")


def summary_data(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` checked against :class:`AuditSummary`, as it is written (raises
    ``pydantic.ValidationError`` for a summary this code must not write)."""
    return AuditSummary.model_validate(summary).dump()


def read_summary_data(data: Any, where: str = AUDIT.summary
                      ) -> tuple[AuditSummary | None, list[dict[str, Any]]]:
    """Lenient reading of a decoded ``summary.json``: a field of the wrong type is dropped and
    named in a skipped-record entry (file ``where``), never trusted. None when it is not a
    JSON object."""
    if not isinstance(data, dict):
        return None, [skipped_row(where, None, "not a JSON object")]
    data = dict(data)
    problems: list[dict[str, Any]] = []
    while True:
        try:
            return AuditSummary.model_validate(data), problems
        except ValidationError as exc:
            bad = sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]} & set(data))
            if not bad:
                raise
            for key in bad:
                data.pop(key)
                problems.append(skipped_row(where, None, f"field {key!r} is malformed; not used"))
