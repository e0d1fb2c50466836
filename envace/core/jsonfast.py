"""JSON text parsed exactly as :func:`json.loads` parses it, with orjson where that is the same.

    data, nonfinite = loads_noting_nonfinite(text)          # raw=: the same text's UTF-8 bytes

The trajectory reader (``envace.core.schema``) parses every input line with it: orjson parses
a 20 kB trajectory in half json's time (issue 44: parsing was the audit's largest cost of its
own). orjson is used only where it gives the very objects json gives, and json (with its error
messages) everywhere else:

- orjson rejects NaN, Infinity and a literal past the float range (json reads them as floats,
  and the reader must know of them: ``nonfinite``), a lone surrogate (json keeps it), a byte
  order mark, and whatever json rejects: those lines go to json;
- orjson reads an integer past 64 bits as a float, json as an int: a line with a run of 19 or
  more digits anywhere (such an integer has at least 19) goes to json;
- orjson nests up to 1024 levels, json as deep as the interpreter's recursion limit lets it
  (3.11: the limit less the frames already on the stack): a line with more opening brackets,
  counted anywhere, than json could surely nest goes to json.

Floats are correctly rounded by both; duplicate keys keep the last value at the first key's
place in both (``tests/core/test_jsonfast.py`` checks this equivalence by property).
orjson is a dependency (pyproject.toml); without it every line goes to json.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - a dependency; json alone gives the same objects
    orjson = None

#: every byte to a space, but digits to "0" (a run of digits becomes a run of "0") and the
#: opening brackets "[" and "{" to "[" (counted at once)
_CLASSES = bytes(48 if 48 <= b <= 57 else 91 if b in b"[{" else 32 for b in range(256))
#: the shortest integer literal that orjson may read as a float (below -2**63 or past 2**64-1)
_LONG_RUN = b"0" * 19
#: frames json.loads may add on top of the caller's, and some to spare (C calls that count)
_MARGIN = 64


def _stack_depth() -> int:
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth += 1
        frame = frame.f_back
    return depth


def _orjson_same(raw: bytes) -> bool:
    """Whether orjson, if it accepts ``raw``, gives what json gives (see the module docstring)."""
    classes = raw.translate(_CLASSES)
    if _LONG_RUN in classes:
        return False
    opening = classes.count(b"[")  # at least the deepest nesting
    return opening + _stack_depth() + _MARGIN < sys.getrecursionlimit()


def json_loads_noting_nonfinite(text: str) -> tuple[Any, bool]:
    """``json.loads(text)`` and whether a number in it was non-finite (the constants NaN and
    Infinity, or a float literal such as 1e999): the hooks see every constant and float
    literal, and return what json's own parsing returns."""
    nonfinite = False

    def constant(name: str) -> float:
        nonlocal nonfinite
        nonfinite = True
        return float(name)  # "NaN", "Infinity", "-Infinity": as json parses them

    def number(literal: str) -> float:
        nonlocal nonfinite
        value = float(literal)
        if not math.isfinite(value):
            nonfinite = True
        return value

    return json.loads(text, parse_constant=constant, parse_float=number), nonfinite


def loads_noting_nonfinite(text: str, raw: bytes | None = None) -> tuple[Any, bool]:
    """:func:`json_loads_noting_nonfinite`'s answer, objects and errors alike, by orjson where
    it gives the same (then nothing was non-finite: orjson accepts only finite numbers).
    ``raw``: ``text`` encoded as UTF-8, when the caller has it (the line as read)."""
    if orjson is not None:
        if raw is None:
            raw = text.encode("utf-8", "surrogatepass")  # a surrogate: orjson rejects it
        if _orjson_same(raw):
            try:
                return orjson.loads(raw), False
            except orjson.JSONDecodeError:
                pass  # json's own error (or its reading of NaN, a big integer, ...)
    return json_loads_noting_nonfinite(text)
