"""Typed records of ``steps.jsonl``: one audited tool call per line (docs/spec/trajectory.md,
"Audit output"), checked on write and read.

    row = StepRow.model_validate(record)          # raises pydantic.ValidationError
    line = step_line(record)                      # one checked steps.jsonl line
    why = step_problem(record)                    # None, or why a decoded line is not a row

Fields are the spec's, in its order; optional ones may be missing or null (files of every earlier
version read); unknown ones are kept as they are.
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

from envace.core.schema import json_text

_STRICT = ConfigDict(strict=True, extra="allow")
Scores = dict[str, FiniteFloat]
Number = Annotated[int | FiniteFloat, Field()]


class ReferenceResponse(BaseModel):
    """What one reference world model answered for a step, scored against reality."""

    model_config = _STRICT
    response: str
    scores: Scores


class Likelihood(BaseModel):
    """How probable the real response is under the audited model (``envace probe
    --likelihood``, ``audit.stats.likelihood``)."""

    model_config = _STRICT
    nats: FiniteFloat = Field(ge=0)  #: minus the log-probability of its tokens and end marker
    tokens: int = Field(ge=0)
    bytes: int = Field(ge=0)  #: UTF-8 bytes of the response text
    bits_per_byte: FiniteFloat | None = None  #: nats / ln 2 / bytes; null for an empty text
    compressor_bits: FiniteFloat | None = None  #: the primed compressor's code length
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
    #: the real call ran past the call limit and was ended; written only when true
    timeout: bool | None = None
    #: the real call's process died during it (a signal, an exit, the memory limit; ``actual``
    #: names which); written only when true
    crashed: bool | None = None
    #: the likelihood audit's figures for the real response (``--likelihood``)
    likelihood: Likelihood | None = None
    likelihood_skipped: str | None = None  #: why the likelihood audit could not score the step
    #: the model's confidence in its own answer (mean token log-probability, ``confidence``)
    confidence: FiniteFloat | None = None
    confidence_min: FiniteFloat | None = None  #: its lowest token log-probability (the probe)
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
