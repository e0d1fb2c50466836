"""Scoring every step of a large audit without paying twice for what does not change.

    scores = score_fast(rehearsed, actual, context, settings.scorers)   # == score_step(...)

The figures are :func:`audit.scoring.scorers.score_step`'s, value for value; two costs that are
not the step's own are cut:

- the scorer functions are built once per scorer list, not once per step;
- when the two texts are identical, the built-in scorers that read nothing but the texts
  (``exact``, ``fuzzy``, ``json_f1``, whatever their options) are not run: each gives exactly
  1.0 there (equal canonical texts; a ratio of equal strings; every paired leaf earns a credit
  of 1, so precision, recall and F1 are 1). Scorers that read the context (error flags, state)
  and scorers registered by plugins always run.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from audit.scoring import scorers as _s
from audit.scoring.scorers import ScoreContext, ScorerFn, ScorerSpec, score_step

#: built-in scorers that are a function of the two texts alone, 1.0 on identical texts
TEXT_ONLY = {"exact": _s.exact, "fuzzy": _s.fuzzy, "json_f1": _s.json_f1}


@lru_cache(maxsize=32)
def _built(names: tuple[str, ...]) -> tuple[tuple[str, ScorerFn, bool], ...]:
    fns = _s._build(list(names))
    return tuple((n, fn, TEXT_ONLY.get(n) is _s._REGISTRY.get(n) is not None)
                 for n, fn in fns.items())


def score_fast(rehearsed: str, actual: str, context: ScoreContext,
               scorers: ScorerSpec) -> dict[str, float]:
    """``{scorer name: value}``, equal to :func:`score_step` with the same arguments."""
    if isinstance(scorers, str | Mapping) or not all(isinstance(n, str) for n in scorers):
        return score_step(rehearsed, actual, context, scorers)  # options: built per call
    same = rehearsed == actual
    return {name: 1.0 if same and text_only else float(fn(rehearsed, actual, context).value)
            for name, fn, text_only in _built(tuple(scorers))}
