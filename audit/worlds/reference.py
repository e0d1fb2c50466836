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

from audit.scoring.canonical import canonical_text
from audit.stats.intervals import mc_error, wilson_ci

IDENTICAL = "identical_to_reference"  # skill's method when the model scores as the reference
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


def _same_value(a: object, b: object) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
            and not isinstance(a, bool) and not isinstance(b, bool):
        return a == b
    return canonical_text(json.dumps(a, default=str)) == canonical_text(json.dumps(b, default=str))


def _number_text(value: object) -> str | None:
    """JSON text of a finite int or float (not a bool), else None (never raises)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    try:
        return json.dumps(value)
    except ValueError:  # an int too long for str()
        return None


def _plain_list(value: object) -> bool:
    """A non-empty list of strings and finite numbers (the lists substituted whole)."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, str) or _number_text(v) is not None for v in value)


def _as_text(value: object) -> str | None:
    """How a string or number argument reads inside a string, else None."""
    if isinstance(value, str):
        return value or None
    return _number_text(value)


def _number_of(value: object) -> float | None:
    """The number a number argument, or a string argument that is a JSON number, stands for."""
    if _number_text(value) is not None:
        return value  # type: ignore[return-value]
    if isinstance(value, str) and _NUMBER.fullmatch(value):
        try:
            number = json.loads(value)
        except ValueError:
            return None
        return number if _number_text(number) is not None else None
    return None


_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_WORD = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def _bounded(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` stands alone: no letter, digit or underscore touches it; a
    number-like match also not after ``.``, ``-`` or ``+`` nor before ``.`` and a digit
    (``5`` is not replaced inside ``15``, ``1.5``, ``-5`` or ``5.5``)."""
    before = text[start - 1] if start else ""
    after = text[end] if end < len(text) else ""
    if before in _WORD or after in _WORD:
        return False
    if text[start].isdigit() and before and before in ".-+":
        return False
    return not (text[end - 1].isdigit() and after == "." and text[end + 1:end + 2].isdigit())


def _replace_in_text(text: str, swaps: Mapping[str, str]) -> str:
    """Every standalone occurrence (:func:`_bounded`) of a key of `swaps` replaced by its value,
    all at once, leftmost first and the longest at one place, never a replacement replaced
    again. Scans with ``str.find``: linear in the text per swap, even for repetitive values."""
    found: list[tuple[int, int, str]] = []
    for old, new in swaps.items():
        at = text.find(old)
        while at != -1:
            if _bounded(text, at, at + len(old)):
                found.append((at, -len(old), new))
            at = text.find(old, at + 1)
    if not found:
        return text
    found.sort()
    out, pos = [], 0
    for at, minus_length, new in found:
        if at < pos:
            continue
        out += [text[pos:at], new]
        pos = at - minus_length
    out.append(text[pos:])
    return "".join(out)


class _Swaps:
    """The differing arguments of two calls, sorted by how they show in a response."""

    def __init__(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        self.text: dict[str, str] = {}  # inside strings: old text -> new text
        self.numbers: list[tuple[float, object]] = []  # number nodes: old number -> new value
        self.lists: list[tuple[list, list]] = []  # list nodes equal to an old list -> new list
        for key, before in old.items():
            if key not in new or _same_value(before, new[key]):
                continue
            after = new[key]
            if _plain_list(before) and _plain_list(after):
                self.lists.append((before, after))
                continue
            old_text, new_text = _as_text(before), _as_text(after)
            if old_text is None or new_text is None:
                continue
            self.text.setdefault(old_text, new_text)
            number = _number_of(before)
            if number is not None:
                replacement = _number_of(after) if isinstance(before, str) else None
                self.numbers.append((number, after if replacement is None else replacement))

    def __bool__(self) -> bool:
        return bool(self.text or self.numbers or self.lists)

    def node(self, value: object) -> object:
        """`value` (a parsed JSON response) with the swaps made; keys are left alone."""
        if isinstance(value, str):
            return _replace_in_text(value, self.text)
        if isinstance(value, dict):
            return {k: self.node(v) for k, v in value.items()}
        if isinstance(value, list):
            for before, after in self.lists:
                if _same_value(value, before):
                    return list(after)
            return [self.node(v) for v in value]
        if _number_text(value) is not None:
            for before, after in self.numbers:
                if value == before:
                    return after
        return value


#: json.dumps styles a response may have been written in; the output keeps the one that
#: reproduces the response (else the first).
_STYLES: tuple[dict[str, Any], ...] = (
    {}, {"ensure_ascii": False}, {"separators": (",", ":")},
    {"separators": (",", ":"), "ensure_ascii": False}, {"indent": 2},
    {"indent": 2, "ensure_ascii": False},
)


def substitute(response: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """`response` (to a call with arguments `old`) with every argument value that `new` gives
    differently replaced by `new`'s, the ``edit`` reference's rewrite.

    An argument is substituted when both calls give it and the values differ: strings and
    numbers (kinds may differ: ``"5"`` may become ``7``) and non-empty lists of those;
    booleans, null, objects and empty values never. A JSON response is parsed and rewritten
    node by node, so the result is JSON again, written in the response's own ``json.dumps``
    style: an old string or number is replaced inside string values wherever it stands alone
    (no letter, digit or underscore touches it, and a number not inside a longer number:
    ``docs`` inside ``docs/a.txt`` yes, inside ``mydocs`` no; ``5`` inside ``15``, ``1.5`` or
    ``-5`` no); a number value equal to an old number (or to an old string that is a number)
    becomes the new value; a list equal to an old list becomes the new list; keys stay. Any
    other response is rewritten as text with the same standalone rule. All replacements in one
    text are made at once, leftmost and longest first, so a replaced value is never replaced
    again. Pure; never raises (on any failure the response comes back unchanged).
    """
    try:
        swaps = _Swaps(old, new)
        if not swaps:
            return response
        try:
            parsed = json.loads(response)
        except (ValueError, RecursionError):
            return _replace_in_text(response, swaps.text)
        rewritten = swaps.node(parsed)
        if json.dumps(rewritten) == json.dumps(parsed):  # nothing replaced (NaN-safe)
            return response
        style = next((s for s in _STYLES if json.dumps(parsed, **s) == response), _STYLES[0])
        return json.dumps(rewritten, **style)
    except Exception:  # noqa: BLE001 - documented: never raises, returns the response
        return response


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
    Steps where either score is not finite (NaN: a scorer with no verdict) are left out, so
    ``n`` counts the steps used. Replicates where the reference mean is 1 are dropped. When the
    replicates have no spread (every resample gives the same skill: a model right on every
    step, or one group) a percentile interval would have zero width; the interval is then the
    Wilson score interval of the model's miss rate with n = the number of groups, divided by
    the reference's miss rate (``method`` says which). A model that scores exactly as the
    reference on every step has skill 0 in every resample: ``point``, ``lo`` and ``hi`` are 0
    (method ``identical_to_reference``). Returns ``point``, ``lo``, ``hi`` (None when
    undefined), ``f_model``, ``f_ref``, ``n``, ``n_boot_used``, ``method`` and ``mc_error``
    (of a percentile interval's endpoints, ``audit.stats.intervals.mc_error``).
    """
    if len(model_values) != len(ref_values):
        raise ValueError("model_values and ref_values must have the same length")
    if groups is not None and len(groups) != len(model_values):
        raise ValueError("groups must have one entry per step")
    m = np.asarray(model_values, dtype=float)
    r = np.asarray(ref_values, dtype=float)
    keep = np.isfinite(m) & np.isfinite(r)
    m, r = m[keep], r[keep]
    if groups is not None:
        groups = [g for g, k in zip(groups, keep, strict=True) if k]
    n = len(m)
    out = {
        "point": None,
        "lo": None,
        "hi": None,
        "f_model": None,
        "f_ref": None,
        "n": n,
        "n_boot_used": 0,
        "method": "bootstrap",
        "mc_error": None,
    }
    if n == 0:
        return out
    f_m, f_r = float(m.mean()), float(r.mean())
    out.update(point=skill(f_m, f_r), f_model=f_m, f_ref=f_r)
    if np.array_equal(m, r) and f_r < 1.0:  # every resample's skill is exactly 0
        out.update(point=0.0, lo=0.0, hi=0.0, method=IDENTICAL, n_boot_used=n_boot)
        return out
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
    values = values[np.isfinite(values)]
    out["n_boot_used"] = int(len(values))
    if not len(values):
        return out
    if np.ptp(values) == 0 and f_r < 1.0:
        miss_lo, miss_hi = wilson_ci((1.0 - f_m) * g, g)
        out.update(lo=1.0 - miss_hi / (1.0 - f_r), hi=1.0 - miss_lo / (1.0 - f_r),
                   method="wilson_groups")
        return out
    alpha = (1 - level) / 2
    lo, hi = np.quantile(values, [alpha, 1 - alpha])
    out["lo"], out["hi"] = float(lo), float(hi)

    out["mc_error"] = mc_error(values, level)
    return out
