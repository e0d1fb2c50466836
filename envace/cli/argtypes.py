"""argparse types for the numbers envace's commands take: a bad value is a usage error (exit 2,
one line) before anything loads, never a traceback from deep inside or a silent nonsense run.

    p.add_argument("--tasks", type=count(0), ...)          # an int >= 0
    p.add_argument("--temperature", type=number(0, None))   # a finite float >= 0
    p.add_argument("--top-p", type=number(0, 1, low_open=True))   # 0 < p <= 1
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

#: The largest count any flag takes (tasks, tokens, turns, seeds ...).
MAX_COUNT = 2**31 - 1


def count(minimum: int, maximum: int = MAX_COUNT) -> Callable[[str], int]:
    """An int from ``minimum`` to ``maximum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from {minimum} to "
                                             f"{maximum}")
        return value

    parse.__name__ = "count"  # argparse names the type in its messages
    return parse


def number(low: float | None, high: float | None, low_open: bool = False
           ) -> Callable[[str], float]:
    """A finite float with ``low <= x <= high`` (``low < x`` when ``low_open``; None: no bound)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        below = low is not None and (value <= low if low_open else value < low)
        if not math.isfinite(value) or below or (high is not None and value > high):
            lo = "" if low is None else (f"> {low:g}" if low_open else f">= {low:g}")
            hi = "" if high is None else f"<= {high:g}"
            raise argparse.ArgumentTypeError(
                f"{text!r}: give a finite number {' and '.join(x for x in (lo, hi) if x)}")
        return value

    parse.__name__ = "number"
    return parse
