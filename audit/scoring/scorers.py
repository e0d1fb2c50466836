"""Fidelity scorers: how well a rehearsed tool response matches the real one.

A scorer is a pure function ``(rehearsed, actual, context) -> Score`` built by a registered
factory (as inspect_ai's scorers are)::

    score = get_scorer("json_f1", string_threshold=0.8)(rehearsed, actual, ScoreContext("ls"))

Registered: ``exact``, ``json_f1``, ``fuzzy``, ``error_agreement``, ``state_change``.
A step *diverges* when the configured :class:`Verdict` says so (``make_verdict``).
Every score lies in [0, 1]; identical responses score 1 under every scorer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rapidfuzz import fuzz

from audit.scoring.canonical import (
    canonical_text,
    flatten_leaves,
    is_error_response,
    is_number,
    numbers_close,
    parse_value,
)

#: The scorers an audit runs unless told otherwise (``envace-audit``, ``envace probe``, the
#: Python API); every one is registered below.
DEFAULT_SCORERS: tuple[str, ...] = ("exact", "json_f1", "fuzzy", "error_agreement")

#: Fuzzy comparison looks at most at this many characters of each side (bounds the work).
MAX_FUZZY_CHARS = 50_000


@dataclass(frozen=True)
class Score:
    """One scorer's judgement of one step."""

    value: float  #: in [0, 1]; 1 means the rehearsal matches reality
    explanation: str = ""  #: a short human-readable reason

    def __post_init__(self) -> None:
        if not (isinstance(self.value, (int, float)) and 0.0 <= self.value <= 1.0):
            raise ValueError(f"Score.value must be a number in [0, 1], got {self.value!r}")


@dataclass
class ScoreContext:
    """What a scorer may know about the step besides the two texts."""

    tool: str = ""  #: the tool called
    arguments: dict = field(default_factory=dict)  #: its keyword arguments
    step: int = 0  #: 0-based index among the trajectory's tool calls
    mutates_state: bool | None = None  #: whether the tool writes state (None: unknown)
    actual_error: bool | None = None  #: the environment's error flag (None: infer from text)
    rehearsed_error: bool | None = None  #: the writer's belief (None: infer from text)
    history_text: str = ""  #: the visible history before the call
    actual_state_changed: bool | None = None  #: state hash differed after the real call


ScorerFn = Callable[[str, str, ScoreContext], Score]
_REGISTRY: dict[str, Callable[..., ScorerFn]] = {}


def register_scorer(name: str) -> Callable[[Callable[..., ScorerFn]], Callable[..., ScorerFn]]:
    """Decorator registering a scorer factory under ``name``."""

    def wrap(factory: Callable[..., ScorerFn]) -> Callable[..., ScorerFn]:
        known = _REGISTRY.get(name)
        if known is not None and known.__qualname__ != factory.__qualname__:
            raise ValueError(f"scorer {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return wrap


def list_scorers() -> list[str]:
    """Names of the registered scorers, sorted."""
    return sorted(_REGISTRY)


def get_scorer(name: str, **options: object) -> ScorerFn:
    """Build the scorer registered as ``name`` with its options."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown scorer {name!r}; known scorers: {', '.join(list_scorers())}")
    try:
        return _REGISTRY[name](**options)
    except TypeError as exc:
        raise ValueError(f"bad options for scorer {name!r}: {exc}") from exc


def _fuzzy_ratio(a: str, b: str) -> tuple[float, bool]:
    """rapidfuzz ratio in [0, 1] on (possibly truncated) texts; also says if it truncated."""
    truncated = len(a) > MAX_FUZZY_CHARS or len(b) > MAX_FUZZY_CHARS
    a, b = a[:MAX_FUZZY_CHARS], b[:MAX_FUZZY_CHARS]
    if a == b:
        return 1.0, truncated
    return min(1.0, max(0.0, fuzz.ratio(a, b) / 100.0)), truncated


@register_scorer("exact")
def exact() -> ScorerFn:
    """1 when the canonical texts are equal, else 0."""

    def score(rehearsed: str, actual: str, context: ScoreContext) -> Score:
        same = canonical_text(rehearsed) == canonical_text(actual)
        return Score(1.0 if same else 0.0, "canonical texts equal" if same else "texts differ")

    return score


@register_scorer("fuzzy")
def fuzzy() -> ScorerFn:
    """rapidfuzz ``fuzz.ratio`` / 100 on the canonical texts."""

    def score(rehearsed: str, actual: str, context: ScoreContext) -> Score:
        value, truncated = _fuzzy_ratio(canonical_text(rehearsed), canonical_text(actual))
        note = f" (first {MAX_FUZZY_CHARS} characters)" if truncated else ""
        return Score(value, f"fuzzy ratio {value:.3f} on canonical text{note}")

    return score


def _leaf_credit(a: object, b: object, rel_tol: float, abs_tol: float, threshold: float) -> float:
    """Credit in [0, 1] for two leaves at the same path."""
    if isinstance(a, bool) or isinstance(b, bool):
        return 1.0 if a is b else 0.0
    if is_number(a) and is_number(b):
        return 1.0 if numbers_close(a, b, rel_tol, abs_tol) else 0.0  # type: ignore[arg-type]
    if isinstance(a, str) and isinstance(b, str):
        if a == b:
            return 1.0
        ratio, _ = _fuzzy_ratio(a, b)
        return ratio if ratio >= threshold else 0.0
    return 1.0 if type(a) is type(b) and a == b else 0.0


@register_scorer("json_f1")
def json_f1(rel_tol: float = 1e-6, abs_tol: float = 0.0, string_threshold: float = 0.9) -> ScorerFn:
    """F1 over flattened ``(path, leaf)`` pairs of the two parsed responses.

    Leaves are paired by identical path. A pair earns credit: numbers 1 when equal within
    ``rel_tol``/``abs_tol``; booleans and nulls 1 when equal; strings their rapidfuzz ratio
    when it reaches ``string_threshold`` (partial credit), else 0; different types 0.
    Precision = credit / rehearsed leaves, recall = credit / actual leaves. Both sides
    without leaves score 1. If either side does not parse, the score falls back to the fuzzy
    ratio of the canonical texts, and the explanation says so.
    """
    if not 0.0 <= string_threshold <= 1.0:
        raise ValueError("string_threshold must lie in [0, 1]")

    def score(rehearsed: str, actual: str, context: ScoreContext) -> Score:
        ok_r, val_r = parse_value(rehearsed)
        ok_a, val_a = parse_value(actual)
        if not (ok_r and ok_a):
            value, _ = _fuzzy_ratio(canonical_text(rehearsed), canonical_text(actual))
            side = "rehearsed" if not ok_r else "actual"
            if not (ok_r or ok_a):
                side = "neither side"
            return Score(value, f"{side} not JSON: fell back to fuzzy ratio {value:.3f}")
        leaves_r, leaves_a = flatten_leaves(val_r), flatten_leaves(val_a)
        if not leaves_r and not leaves_a:
            return Score(1.0, "both sides empty")
        credit = math.fsum(  # sorted paths: the sum, hence F1, is exactly symmetric
            _leaf_credit(leaves_r[path], leaves_a[path], rel_tol, abs_tol, string_threshold)
            for path in sorted(leaves_r.keys() & leaves_a.keys())
        )
        precision = credit / len(leaves_r) if leaves_r else 0.0
        recall = credit / len(leaves_a) if leaves_a else 0.0
        f1 = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
        f1 = min(1.0, max(0.0, f1))
        return Score(
            f1,
            f"F1 {f1:.3f} (precision {precision:.3f} over {len(leaves_r)} rehearsed leaves, "
            f"recall {recall:.3f} over {len(leaves_a)} actual leaves)",
        )

    return score


def _errors(rehearsed: str, actual: str, context: ScoreContext) -> tuple[bool, bool]:
    r_err = context.rehearsed_error
    a_err = context.actual_error
    return (
        is_error_response(rehearsed) if r_err is None else bool(r_err),
        is_error_response(actual) if a_err is None else bool(a_err),
    )


@register_scorer("error_agreement")
def error_agreement() -> ScorerFn:
    """1 when both responses are failures or both are not (did the model predict the failure?).

    Error flags come from the context when given, else from :func:`is_error_response`.
    """

    def score(rehearsed: str, actual: str, context: ScoreContext) -> Score:
        r_err, a_err = _errors(rehearsed, actual, context)
        word = {True: "error", False: "success"}
        return Score(
            1.0 if r_err == a_err else 0.0, f"rehearsed {word[r_err]}, actual {word[a_err]}"
        )

    return score


@register_scorer("state_change")
def state_change() -> ScorerFn:
    """Did the rehearsal predict whether the call changes the environment's state?

    A rehearsed response *claims* a change when the tool writes state and the response is not
    an error. The real change is ``context.actual_state_changed`` (state hash before/after)
    when known, else "the write did not fail". Score 1 when they agree, else 0.
    Read-only tools (``mutates_state`` False, and no observed change) score 1: there is nothing
    to predict; so do steps with no state information at all. Caveat: a successful write that
    happens to leave the state unchanged (setting a value to itself) counts as a disagreement
    when the state hash is known.
    """

    def score(rehearsed: str, actual: str, context: ScoreContext) -> Score:
        observed = context.actual_state_changed
        if context.mutates_state is False and observed is not True:
            return Score(1.0, "read-only tool: no state change to predict")
        if context.mutates_state is None and observed is None:
            return Score(1.0, "no state information: not scored")
        r_err, a_err = _errors(rehearsed, actual, context)
        claims = not r_err
        changed = observed if observed is not None else not a_err
        agree = claims == changed
        return Score(
            1.0 if agree else 0.0,
            f"rehearsal {'claims' if claims else 'denies'} a change; "
            f"real state {'changed' if changed else 'unchanged'}",
        )

    return score


@dataclass(frozen=True)
class Verdict:
    """A step diverges when ``scores[scorer] < threshold``."""

    scorer: str = "exact"
    threshold: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"verdict threshold must lie in [0, 1], got {self.threshold}")

    def __call__(self, scores: Mapping[str, float]) -> bool:
        if self.scorer not in scores:
            raise KeyError(f"verdict scorer {self.scorer!r} missing from scores {list(scores)}")
        return float(scores[self.scorer]) < self.threshold


def make_verdict(scorer: str = "exact", threshold: float = 1.0) -> Verdict:
    """The divergence rule: ``diverged = scores[scorer] < threshold``."""
    if scorer not in _REGISTRY:
        raise ValueError(f"unknown scorer {scorer!r}; known scorers: {', '.join(list_scorers())}")
    return Verdict(scorer, threshold)


ScorerSpec = Sequence[str] | Mapping[str, Mapping[str, object]]


def _build(scorers: ScorerSpec) -> dict[str, ScorerFn]:
    if isinstance(scorers, Mapping):
        return {name: get_scorer(name, **dict(opts or {})) for name, opts in scorers.items()}
    if isinstance(scorers, str):
        scorers = [scorers]
    return {name: get_scorer(name) for name in scorers}


def score_step_explained(
    rehearsed: str, actual: str, context: ScoreContext, scorers: ScorerSpec
) -> dict[str, Score]:
    """Every named scorer's :class:`Score` for one step.

    ``scorers`` is a list of names, or a mapping ``{name: options}``.
    """
    fns = _build(scorers)
    return {name: fn(rehearsed, actual, context) for name, fn in fns.items()}


def score_step(
    rehearsed: str, actual: str, context: ScoreContext, scorers: ScorerSpec
) -> dict[str, float]:
    """``{scorer name: value}`` for one step (see :func:`score_step_explained`)."""
    detailed = score_step_explained(rehearsed, actual, context, scorers)
    return {name: float(s.value) for name, s in detailed.items()}
