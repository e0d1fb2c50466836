"""Step records as the fidelity statistics read them, and the helpers every statistic shares.

A *step record* is a dict with at least ``trajectory_id``, ``depth`` (0-based depth among the
trajectory's rehearsed calls; ``step`` is used when a record has no ``depth``), ``tool``,
``diverged`` (bool), ``scores`` (``{scorer: value}``), ``mutates_state`` (bool or None) and
optionally ``novelty`` (:func:`novelty`, computed by replay) and ``cluster`` (the resampling
unit's cluster, ``audit.stats.clusters``). Records whose ``diverged`` is not a bool are left out
of divergence statistics (:func:`scored_steps`). :func:`clean` makes any result JSON-safe.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

Step = dict
_TOKEN = re.compile(r"\d+(?:\.\d+)?|[^\W\d]+")
#: the same tokens of an ASCII text, lower-cased: ``\d`` is ``[0-9]`` there and ``[^\W\d]``
#: (letters and the underscore) ``[a-z_]`` once lower-cased; 1.7x faster than the Unicode
#: classes (issue 44, the audit's largest cost of its own). The lookahead names the only
#: characters a token starts with (each branch's first), which changes no match and lets
#: the engine skip the rest faster: 17.6 ns a character, not 20.7 (BFCL's messages)
_ASCII_TOKEN = re.compile(r"(?=[0-9a-z_])(?:[0-9]+(?:\.[0-9]+)?|[a-z_]+)")


def tokens(text: str) -> list[str]:
    """:func:`novelty`'s tokens of ``text``, in order: lower-cased numbers and runs of
    letters or underscores."""
    if text.isascii():
        return _ASCII_TOKEN.findall(text.lower())
    return _TOKEN.findall(text.lower())


def clean(value: object) -> object:
    """Recursively make ``value`` JSON-safe: numpy → Python, NaN/inf → None, tuples → lists."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return [clean(v) for v in value.tolist()]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    return value


def is_finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def depth_of(s: Step) -> int:
    d = s.get("depth")
    return int(s["step"] if d is None else d)


def scored_steps(steps: Iterable[Step]) -> list[Step]:
    return [s for s in steps if isinstance(s.get("diverged"), (bool, np.bool_))]


def scorer_names(steps: Sequence[Step], scorers: Sequence[str] | None) -> list[str]:
    if scorers is not None:
        return list(scorers)
    return sorted({name for s in steps for name in (s.get("scores") or {})})


def cluster_of(s: Step) -> object:
    """A step's resampling cluster: its ``cluster`` (``audit.stats.clusters``), else its
    trajectory."""
    c = s.get("cluster")
    return s.get("trajectory_id") if c is None else c


def score_of(s: Step, name: str) -> float:
    v = (s.get("scores") or {}).get(name)
    return float(v) if is_finite(v) else math.nan


def by_trajectory(steps: Iterable[Step]) -> dict[str, list[Step]]:
    """Steps by trajectory id (ids sorted, so bootstraps do not depend on the input order)."""
    groups: dict[str, list[Step]] = defaultdict(list)
    for s in steps:
        groups[str(s.get("trajectory_id"))].append(s)
    return {t: sorted(groups[t], key=depth_of) for t in sorted(groups)}


def novelty(actual: str, history_text: str) -> float:
    """Share of the actual response's tokens that never occur in the visible history.

    Tokens: lower-cased numbers (``12``, ``3.5``) and runs of letters/underscores
    (``file_name``), counted with multiplicity. A response without tokens has novelty 0.
    """
    found = tokens(actual)
    if not found:
        return 0.0
    seen = set(tokens(history_text))
    return sum(1 for t in found if t not in seen) / len(found)
