"""Typed, versioned records of an audit directory's ``summary.json`` (its step rows:
``audit.store.step_rows``).

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

from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from envace.core.layout import AUDIT

SUMMARY_VERSION = "envace.audit/2"  # /2: statistics over rehearsed steps, trajectory bootstrap
SCHEMA_PREFIX = "envace.audit/"

_STRICT = ConfigDict(strict=True, extra="allow")
Scores = dict[str, FiniteFloat]
Number = Annotated[int | FiniteFloat, Field()]


# ---------------------------------------------------------------- summary.json


class Block(BaseModel):
    """A block of ``summary.json``: the fields the code reads are typed, every other field is
    kept as written (a newer writer's, a plugin's), and the block is dumped with its fields in
    the order it was given, so a stored summary round-trips byte for byte."""

    model_config = _STRICT
    #: dumped in the order given (False: in the order the fields are declared, unknown ones last)
    given_order: ClassVar[bool] = True
    _order: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        block = handler(data)
        if cls.given_order and isinstance(data, dict) and isinstance(block, Block):
            block._order = tuple(data)
        return block

    @model_serializer(mode="wrap")
    def _in_given_order(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        if not self._order or not isinstance(out, dict):
            return out
        rank = {k: i for i, k in enumerate(self._order)}
        return dict(sorted(out.items(), key=lambda kv: rank.get(kv[0], len(rank))))

    def dump(self) -> dict[str, Any]:
        """The block as written: the fields it was given, in the order given."""
        return self.model_dump(by_alias=True, exclude_unset=True)


class Skipped(Block):
    """A record that was not audited: where it is and why (``line`` None: a whole file)."""

    file: str
    line: int | None
    reason: str
    kept_in: str | None = None  #: ``steps.unreadable.jsonl:N`` where rescore kept its bytes

    def row(self) -> dict[str, Any]:
        """The entry of ``skipped_records`` (``kept_in`` only where rescore set it)."""
        return self.model_dump(exclude={"kept_in"} if self.kept_in is None else set())


def place(row: dict[str, Any]) -> str:
    """Where a skipped record or a warning is: ``file:line``, or the file alone when the record
    is a whole file (``line`` None: a summary.json, a missing input), never ``file:None``."""
    line = row.get("line")
    return f"{row.get('file')}:{line}" if line is not None else str(row.get("file"))


def skipped_row(file: str | Any, line: int | None, reason: str) -> dict[str, Any]:
    """One ``skipped_records`` entry, checked against :class:`Skipped` (every place that skips a
    record writes it through here, so the shape has one definition)."""
    return Skipped(file=str(file), line=line, reason=str(reason)).row()


class Warning_(Block):
    """A note about an audited record (non-finite numbers, unknown tools)."""

    file: str
    line: int | None
    trajectory_id: Any
    message: str


class VerdictRule(Block):
    """diverged = scores[scorer] < threshold."""

    scorer: str
    threshold: FiniteFloat


#: a number inside a statistics block (non-finite ones were written before the blocks were typed)
Real = int | float
Bounds = list[Real | None]


class Counts(Block):
    """``counts``: how many records, trajectories and steps the audit read and scored."""

    records_read: int | None = None
    trajectories: int | None = None
    skipped: int | None = None
    steps: int | None = None
    answered_steps: int | None = None
    unanswered_steps: int | None = None
    malformed_calls: int | None = None
    scored_steps: int | None = None


class Statistics(Block):
    """``statistics``: which steps every figure counts."""

    population: str | None = None
    real_steps_excluded: int | None = None
    unmarked_steps_counted_as_rehearsed: int | None = None


class IntervalInfo(Block):
    """``interval``: how the intervals were made (method, resamples, seed, unit)."""

    method: str | None = None
    resamples: int | None = None
    seed: int | None = None
    level: Real | None = None
    resampling_unit: str | None = None


class ScoreStat(Block):
    """A scorer's mean over a group of steps, with its interval."""

    mean: Real | None = None
    ci: Bounds | None = None
    n: int | None = None
    method: str | None = None
    mc_error: Real | None = None


class Stratum(Block):
    """One group of steps (a depth, a tool, read or write, a novelty bin): its divergence rate
    with interval and its scores."""

    n: int | None = None
    trajectories: int | None = None
    diverged: int | None = None
    divergence_rate: Real | None = None
    divergence_ci: Bounds | None = None
    divergence_ci_method: str | None = None
    scores: dict[str, ScoreStat] | None = None


class DepthRow(Stratum):
    """A row of ``by_depth``: the stratum of one rehearsed-step depth."""

    depth: int


class SurvivalRow(Block):
    """A row of the first-divergence survival curve."""

    depth: int
    at_risk: int | None = None
    events: int | None = None
    censored: int | None = None
    hazard: Real | None = None
    survival: Real | None = None
    ci: Bounds | None = None


class FirstDivergence(Block):
    """``first_divergence``: the survival curve of the first divergence by depth."""

    rows: list[SurvivalRow] | None = None
    median: Any = None
    n_trajectories: int | None = None
    n_events: int | None = None
    n_censored: int | None = None


class ConditionalRow(Block):
    """A row of ``compounding.by_depth``: divergence after an earlier one and after none."""

    depth: int
    p_after_divergence: Real | None = None
    p_no_prior_divergence: Real | None = None


class Compounding(Block):
    """``compounding``: P(diverge | an earlier divergence) / P(diverge | none), with its table,
    its rows by depth and the depth trend."""

    ratio: Real | None = None
    ci: Bounds | None = None
    ci_method: str | None = None
    ci_mc_error: Real | None = None
    p_after_divergence: Real | None = None
    p_no_prior_divergence: Real | None = None
    table: dict[str, int] | None = None
    n_steps: int | None = None
    n_trajectories: int | None = None
    by_depth: list[ConditionalRow] | None = None
    note: str | None = None
    depth_trend: dict[str, Any] | None = None


class Logistic(Block):
    """``logistic``: divergence modelled on depth, prior divergence and novelty."""

    n: int | None = None
    features: list[str] | None = None
    odds_ratio_prior_divergence: Real | None = None
    odds_ratio_ci: Bounds | None = None
    note: str | None = None


class SkillInterval(Block):
    """Skill (F - F_ref) / (1 - F_ref) against one reference, with its interval."""

    point: Real | None = None
    lo: Real | None = None
    hi: Real | None = None
    f_ref: Real | None = None
    method: str | None = None
    mc_error: Real | None = None


class SkillRow(SkillInterval):
    """A scorer's skill against the best reference world model, and against each."""

    reference_means: dict[str, Real | None] | None = None
    best_reference: str | None = None
    f_model: Real | None = None
    n: int | None = None
    against: dict[str, SkillInterval] | None = None


class Skill(Block):
    """``skill``: the audited model against the reference world models."""

    references: list[str] | None = None
    by_scorer: dict[str, SkillRow] | None = None


class Rate(Block):
    """A rate with its interval (``point``, ``ci``) and, for a share of events, their count."""

    point: Real | None = None
    ci: Bounds | None = None
    method: str | None = None
    count: int | None = None
    note: str | None = None


class Difference(Block):
    """A paired difference of two rates, with its interval and test."""

    diff: Real | None = None
    ci: Bounds | None = None
    p_value: Real | None = None
    method: str | None = None


class HistoryGroup(Block):
    """The same calls rehearsed given the real and the own history, over one group of calls."""

    n: int | None = None
    trajectories: int | None = None
    real: Rate | None = None
    own: Rate | None = None
    diff: Difference | None = None
    induced: Rate | None = None
    recovered: Rate | None = None


class HistoryDepthRow(HistoryGroup):
    """A row of ``history.by_depth``."""

    depth: int


class DeepHistory(HistoryGroup):
    """``history.deep``: the calls at depth >= ``min_depth``."""

    min_depth: int | None = None
    compounding_share: Rate | None = None


class History(Block):
    """``history`` (``envace probe --history both``): divergence split into difficulty (real
    history) and compounding (own history)."""

    method: str | None = None
    pairs: int | None = None
    overall: HistoryGroup | None = None
    compounding_share: Rate | None = None
    deep: DeepHistory | None = None
    by_depth: list[HistoryDepthRow] | None = None
    by_mutates_state: dict[str, HistoryGroup] | None = None
    by_novelty: dict[str, HistoryGroup] | None = None


class CompressorReference(Block):
    """``likelihood.compressor``: the primed compressor's bits per byte on the same calls."""

    method: str | None = None
    bits_per_byte: Rate | None = None
    steps: int | None = None


class LikelihoodBlock(Block):
    """``likelihood`` (``envace probe --likelihood``, ``audit.stats.likelihood``): pooled bits
    per byte of the real responses under the model, beside the primed compressor's."""

    unit: str | None = None
    steps: int | None = None
    trajectories: int | None = None
    clusters: int | None = None
    nats: Real | None = None
    tokens: int | None = None
    bytes: int | None = None
    bits_per_byte: Rate | None = None
    mean_step_bits_per_byte: Rate | None = None
    not_scored: dict[str, int] | None = None
    compressor: CompressorReference | None = None
    model_minus_compressor: Difference | None = None
    by_depth: dict[str, dict[str, Any]] | None = None
    by_tool: dict[str, dict[str, Any]] | None = None
    by_mutates_state: dict[str, dict[str, Any]] | None = None
    by_novelty: dict[str, dict[str, Any]] | None = None


class ConfidenceBlock(Block):
    """``confidence`` (``audit.stats.confidence``): how well the model's confidence in its own
    answer predicts that it diverged: AUROC, the risk-coverage curve and its headline."""

    measure: str | None = None
    steps: int | None = None
    of_scored_steps: int | None = None
    divergence_rate: Real | None = None
    auroc: Rate | None = None
    auroc_min: Real | None = None
    coverage_at_risk: dict[str, Any] | None = None
    reliability: list[dict[str, Any]] | None = None
    risk_coverage: list[dict[str, Any]] | None = None


class StateStratum(Stratum):
    """One stratum of ``by_state_change``: the calls that changed that many state leaves."""

    writes: int | None = None
    skill: dict[str, SkillRow] | None = None


class Cliff(Block):
    """``by_state_change.cliff``: divergence on calls that changed no state leaf against
    calls that changed several, their paired difference and the verdict."""

    low: list[str] | None = None
    high: list[str] | None = None
    n_low: int | None = None
    n_high: int | None = None
    low_rate: Real | None = None
    high_rate: Real | None = None
    diff: Real | None = None
    ci: Bounds | None = None
    p_value: Real | None = None
    method: str | None = None
    present: bool | None = None
    note: str | None = None


class StateChangeBlock(Block):
    """``by_state_change`` (issue 43, ``audit.stats.state_change``): fidelity by how many
    leaves of the real state each call changed, the cliff test, and the claims of calls."""

    strata: dict[str, StateStratum] | None = None
    buckets: list[str] | None = None
    cliff: Cliff | None = None
    claims: dict[str, dict[str, Any]] | None = None
    question: str | None = None


class AuditSummary(Block):
    """``summary.json`` of an audit (docs/spec/trajectory.md, "Audit output"), fields in the
    order they are written (a field not declared here, a newer writer's or a plugin's, is kept
    and written last). Every field may be missing (an older or damaged file); inside each
    block, fields keep the order they were given."""

    given_order: ClassVar[bool] = False

    schema_: str | None = Field(default=None, alias="schema")
    inputs: list[str] | None = None
    scorers: list[str] | None = None
    verdict: VerdictRule | None = None
    reference_file: str | None = None
    audited_model: str | None = None
    counts: Counts | None = None
    resampling_unit: str | None = None  #: what the intervals resample (audit.stats.clusters)
    resampling_unit_note: str | None = None  #: why the unit fell back to the task
    reconciles: bool | None = None
    skipped_records: list[Skipped] | None = None
    warnings: list[Warning_] | None = None
    statistics: Statistics | None = None
    determinism_check: bool | None = None
    determinism_warning: str | None = None
    by_source: dict[str, Any] | None = None
    error_prediction: dict[str, Any] | None = None
    divergence_rate: Number | None = None
    divergence_ci: list[Number | None] | None = None
    divergence_ci_method: str | None = None
    divergence_ci_mc_error: Number | None = None
    scores: dict[str, ScoreStat] | None = None
    by_depth: list[DepthRow] | None = None
    by_tool: dict[str, Stratum] | None = None
    by_mutates_state: dict[str, Stratum] | None = None
    by_novelty: dict[str, Stratum] | None = None
    first_divergence: FirstDivergence | None = None
    median_first_divergence: Any = None
    compounding: Compounding | None = None
    logistic: Logistic | None = None
    interval: IntervalInfo | None = None
    skill: Skill | None = None
    by_state_change: StateChangeBlock | None = None  #: fidelity by state leaves changed (issue 43)
    seconds: Number | None = None
    reference_counts: dict[str, int] | None = None
    reference_skipped_records: list[Skipped] | None = None
    probe: str | None = None
    histories: list[str] | None = None
    history: History | None = None
    likelihood: LikelihoodBlock | None = None
    likelihood_scorer: dict[str, Any] | None = None
    confidence: ConfidenceBlock | None = None
    rescored_from: str | None = None
    recomputed_from: dict[str, Any] | None = None
    shard: dict[str, Any] | None = None  #: a shard's index, count, inputs, settings (audit.shard)

    @property
    def scored_steps(self) -> int | None:
        """How many steps the statistics count (``answered_steps`` in ``envace.audit/1``)."""
        c = self.counts or Counts()
        if self.schema_ == SUMMARY_VERSION or "scored_steps" in c.model_fields_set:
            return c.scored_steps
        return c.answered_steps


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
