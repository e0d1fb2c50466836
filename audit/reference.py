"""Trivial reference world models and skill scores.

A fidelity figure means little alone: on BFCL a lookup table of training calls already
rehearses about half of held-out responses exactly. Every figure therefore stands beside the
same figure for a reference that needs no neural model, built from training triples
``(tool, arguments, response)``:

- ``majority``: the most common training response of the tool (unseen tool: ``"{}"``);
- ``lookup``: the most common response to the identical call (same tool, same canonical
  arguments), else ``majority``;
- ``echo``: the arguments as JSON;
- ``empty``: ``"{}"``.

``skill = (F - F_ref) / (1 - F_ref)``: 1 is perfect, 0 no better than the reference,
negative worse. ``skill_with_ci`` adds a paired bootstrap interval.

Example::

    ref = build_reference("lookup", triples)
    ref("cd", {"folder": "docs"})
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from audit.canonical import canonical_text

REFERENCE_NAMES = ("majority", "lookup", "echo", "empty")
EMPTY = "{}"

Reference = Callable[[str, dict], str]


def canonical_arguments(arguments: object) -> str:
    """Arguments as compact JSON with sorted keys (the lookup key); never raises."""
    try:
        return json.dumps(
            arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
        )
    except (TypeError, ValueError):
        return repr(arguments)


class _Tally:
    """Counts responses by canonical form; remembers the first raw text seen for each form."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.raw: dict[str, str] = {}

    def add(self, response: str) -> None:
        key = canonical_text(response)
        self.counts[key] += 1
        self.raw.setdefault(key, response)

    def best(self) -> str:
        # most_common is stable: ties go to the form seen first
        return self.raw[self.counts.most_common(1)[0][0]]


def most_common_response(responses: Iterable[str]) -> str:
    """The most common response, counting texts equal after :func:`canonical_text` as one;
    the first raw text seen of the winning form; ties go to the form seen first."""
    tally = _Tally()
    for response in responses:
        tally.add(response)
    return tally.best()


def _majority_table(triples: Sequence[tuple[str, dict, str]]) -> dict[str, str]:
    tallies: dict[str, _Tally] = defaultdict(_Tally)
    for tool, _, response in triples:
        tallies[tool].add(response)
    return {tool: t.best() for tool, t in tallies.items()}


def build_reference(name: str, triples: Iterable[tuple[str, dict, str]] = ()) -> Reference:
    """A reference world model ``(tool, arguments) -> response`` built from training triples.

    Counting treats responses equal after :func:`canonical_text` as one; the response
    returned is the first raw text seen of the winning form; ties go to the form seen first.
    """
    if name not in REFERENCE_NAMES:
        raise ValueError(f"unknown reference {name!r}; known: {', '.join(REFERENCE_NAMES)}")
    if name == "empty":
        return lambda tool, arguments: EMPTY
    if name == "echo":
        return lambda tool, arguments: json.dumps(
            arguments, sort_keys=True, ensure_ascii=False, default=str
        )
    data = list(triples)
    majority = _majority_table(data)
    if name == "majority":
        return lambda tool, arguments: majority.get(tool, EMPTY)
    calls: dict[tuple[str, str], _Tally] = defaultdict(_Tally)
    for tool, arguments, response in data:
        calls[(tool, canonical_arguments(arguments))].add(response)
    table = {key: t.best() for key, t in calls.items()}

    def lookup(tool: str, arguments: dict) -> str:
        hit = table.get((tool, canonical_arguments(arguments)))
        return hit if hit is not None else majority.get(tool, EMPTY)

    return lookup


def skill(f_model: float | None, f_ref: float | None) -> float | None:
    """``(F - F_ref) / (1 - F_ref)``; None when ``F_ref`` is 1 (no room to improve) or missing."""
    if f_model is None or f_ref is None:
        return None
    if not (math.isfinite(f_model) and math.isfinite(f_ref)) or f_ref >= 1.0:
        return None
    return (f_model - f_ref) / (1.0 - f_ref)


def skill_with_ci(
    model_values: Sequence[float],
    ref_values: Sequence[float],
    groups: Sequence[str] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """Skill of the mean model score over the mean reference score, with a paired bootstrap CI.

    ``model_values[i]`` and ``ref_values[i]`` score the same step. The bootstrap resamples
    steps, or whole groups (trajectory ids) when ``groups`` is given, keeping pairs together.
    Replicates where the reference mean is 1 are dropped. Returns ``point``, ``lo``, ``hi``
    (None when undefined), ``f_model``, ``f_ref``, ``n`` and ``n_boot_used``.
    """
    if len(model_values) != len(ref_values):
        raise ValueError("model_values and ref_values must have the same length")
    if groups is not None and len(groups) != len(model_values):
        raise ValueError("groups must have one entry per step")
    m = np.asarray(model_values, dtype=float)
    r = np.asarray(ref_values, dtype=float)
    n = len(m)
    out = {
        "point": None,
        "lo": None,
        "hi": None,
        "f_model": None,
        "f_ref": None,
        "n": n,
        "n_boot_used": 0,
    }
    if n == 0:
        return out
    f_m, f_r = float(m.mean()), float(r.mean())
    out.update(point=skill(f_m, f_r), f_model=f_m, f_ref=f_r)
    if n_boot <= 0:
        return out
    if groups is None:
        codes = np.arange(n)
    else:
        _, codes = np.unique(np.asarray([str(g) for g in groups]), return_inverse=True)
    g = int(codes.max()) + 1
    sum_m = np.bincount(codes, weights=m, minlength=g)
    sum_r = np.bincount(codes, weights=r, minlength=g)
    size = np.bincount(codes, minlength=g).astype(float)
    rng = np.random.default_rng(seed)
    batch = max(1, 2_000_000 // g)
    skills = []
    for start in range(0, n_boot, batch):
        idx = rng.integers(0, g, size=(min(batch, n_boot - start), g))
        cnt = size[idx].sum(axis=1)
        bm = sum_m[idx].sum(axis=1) / cnt
        br = sum_r[idx].sum(axis=1) / cnt
        ok = br < 1.0
        skills.append((bm[ok] - br[ok]) / (1.0 - br[ok]))
    values = np.concatenate(skills)
    out["n_boot_used"] = int(len(values))
    if len(values):
        alpha = (1 - level) / 2
        lo, hi = np.quantile(values, [alpha, 1 - alpha])
        out["lo"], out["hi"] = float(lo), float(hi)
    return out
