"""Trivial reference world models and skill scores.

A fidelity figure means little alone: on BFCL a lookup table of training calls already
rehearses about half of held-out responses exactly. Every figure therefore stands beside the
same figure for a reference that needs no neural model, built from training triples
``(tool, arguments, response)``:

- ``majority``: the most common training response of the tool (unseen tool: ``"{}"``);
- ``lookup``: the most common response to the identical call (same tool, same canonical
  arguments), else ``majority``;
- ``edit``: ``lookup``'s answer to an identical call; otherwise the response of the most
  similar training call of the tool (rapidfuzz ``ratio`` between canonical arguments, ties to
  the first seen) with the argument values that differ substituted (:func:`substitute`):
  ``cd({"folder": "docs"}) -> {"current_working_directory": "docs"}`` answers ``cd({"folder":
  "tmp"})`` with ``{"current_working_directory": "tmp"}``. It copies, knows no state and
  computes nothing; a world model that only copies arguments into responses it has seen does
  no better than this;
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
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from rapidfuzz import fuzz

from audit.canonical import canonical_text

REFERENCE_NAMES = ("majority", "lookup", "edit", "echo", "empty")
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


def rank_by_similarity(query: str, keys: Sequence[str]) -> list[int]:
    """Indices of `keys` (canonical argument JSON), most similar to `query` first: rapidfuzz's
    ``fuzz.ratio`` (normalised Indel similarity), ties by position; an identical key first."""
    scored = sorted((-fuzz.ratio(query, key), i) for i, key in enumerate(keys))
    return [i for _, i in scored]


def _value_forms(value: object) -> tuple[list[str], bool] | None:
    """The texts under which an argument value shows inside a JSON response and whether they
    are numbers, or None when it is not substituted (booleans, null, empty strings, objects,
    lists holding more than strings and numbers)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        if not value:
            return None
        return list(dict.fromkeys([json.dumps(value, ensure_ascii=False)[1:-1],
                                   json.dumps(value)[1:-1]])), False
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return [json.dumps(value)], True
    if isinstance(value, list) and all(
            isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        try:
            forms = [json.dumps(value, ensure_ascii=False), json.dumps(value),
                     json.dumps(value, ensure_ascii=False, separators=(",", ":"))]
        except ValueError:  # NaN inside
            return None
        return list(dict.fromkeys(forms)), False
    return None


def _same_value(a: object, b: object) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
            and not isinstance(a, bool) and not isinstance(b, bool):
        return a == b
    return canonical_text(json.dumps(a, default=str)) == canonical_text(json.dumps(b, default=str))


def _alternatives(texts: Iterable[str]) -> str:
    return "|".join(re.escape(t) for t in sorted(texts, key=lambda t: (-len(t), t)))


def substitute(response: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """`response` (to a call with arguments `old`) with every argument value that `new` gives
    differently replaced by `new`'s, the ``edit`` reference's rewrite.

    An argument is substituted when both calls give it, the values differ and both are strings,
    numbers or lists of those (kinds may differ: ``"5"`` may become ``7``); it is found in the
    response as JSON writes it (a string without its quotes, escaped as ``json.dumps`` escapes
    it with or without ``ensure_ascii``; a number; a list in default or compact separators),
    and only where no letter, digit or underscore touches it (``docs`` is replaced inside
    ``docs/a.txt``, not inside ``mydocs``); a number neither where a ``.`` or a digit goes on
    (``5`` is not replaced inside ``15`` or ``5.5``). All replacements are made at once,
    longest text first, so a replaced value is never replaced again. Pure; never raises.
    """
    swaps: dict[str, str] = {}
    numbers: set[str] = set()
    for key, before in old.items():
        if key not in new or _same_value(before, new[key]):
            continue
        got_before, got_after = _value_forms(before), _value_forms(new[key])
        if not got_before or not got_after:
            continue
        (forms_before, numeric), (forms_after, _) = got_before, got_after
        for i, text in enumerate(forms_before):
            if text not in swaps:
                swaps[text] = forms_after[min(i, len(forms_after) - 1)]
                if numeric:
                    numbers.add(text)
    if not swaps:
        return response
    parts = []
    texts = [t for t in swaps if t not in numbers]
    if texts:
        parts.append(r"(?<![A-Za-z0-9_])(?:" + _alternatives(texts) + r")(?![A-Za-z0-9_])")
    if numbers:
        parts.append(r"(?<![A-Za-z0-9_.])(?:" + _alternatives(numbers)
                     + r")(?![A-Za-z0-9_]|\.[0-9])")
    return re.sub("|".join(parts), lambda m: swaps[m.group(0)], response)


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

    if name == "lookup":
        return lookup
    # edit: distinct (arguments, response) pairs per tool, first seen first
    pairs: dict[str, dict[tuple[str, str], tuple[dict, str]]] = defaultdict(dict)
    for tool, arguments, response in data:
        pairs[tool].setdefault((canonical_arguments(arguments), canonical_text(response)),
                               (arguments, response))
    keys = {tool: [k for k, _ in p] for tool, p in pairs.items()}
    values = {tool: list(p.values()) for tool, p in pairs.items()}

    def edit(tool: str, arguments: dict) -> str:
        query = canonical_arguments(arguments)
        hit = table.get((tool, query))
        if hit is not None:
            return hit
        if tool not in keys:
            return EMPTY
        before, response = values[tool][rank_by_similarity(query, keys[tool])[0]]
        if not isinstance(before, Mapping) or not isinstance(arguments, Mapping):
            return response
        return substitute(response, before, arguments)

    return edit


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
