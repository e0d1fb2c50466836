"""Where a step's time goes: named sections on one monotonic clock, every second counted once.

    timer = StepTimer()
    with timer.section("rollout"):
        with timer.section("rollout/decode"):
            ...
    timer.stop()
    timer.metrics(STEP_SECTIONS)   # {"time/rollout/decode": ..., "time/rollout/other": ...,
                                   #  "time/other": ..., "time/step": ...}

Time is *exclusive*: while a section runs inside another, the outer one's clock stands still, so
the sections (the time outside every section being ``other``) add up to the whole
(``time/step``) exactly: every interval between two consecutive clock readings is charged to the
one section innermost at that moment. A section is entered and left with two
``time.perf_counter`` readings and some dictionary arithmetic; nothing else (no device work, no
global state). ``sync`` (say ``torch.cuda.synchronize``) runs before each reading when given:
then time spent by queued GPU kernels is charged to the section that launched them, at the cost
of a pipeline stall per section boundary. ``wrap`` adds a context per section (the profiler's
``record_function``), so profiles show the same sections.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

# the sections of a training step, in the order they run (envace.training.train); a name with
# children here reports its own (exclusive) time as "<name>/other"
STEP_SECTIONS = (
    "rollout/prefill", "rollout/decode", "rollout/forced", "rollout",
    "weight_sync", "reward", "fidelity", "fidelity_nll",
    "update/forward", "update/backward", "update/optimizer", "update",
    "checkpoint", "eval",
)


class StepTimer:
    """Exclusive wall time per named section, from ``start`` (construction) to ``stop``."""

    def __init__(self, sync: Callable[[], object] | None = None,
                 wrap: Callable[[str], AbstractContextManager[object]] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._sync, self._wrap, self._clock = sync, wrap, clock
        self._stack: list[str] = [""]  # "" is the time outside every section
        self._seconds: dict[str, float] = {}
        self._start = self._last = self._now()
        self._end: float | None = None

    def _now(self) -> float:
        if self._sync is not None:
            self._sync()
        return self._clock()

    def _switch(self, push: str | None) -> None:
        """Charge the time since the last reading to the innermost section, then enter ``push``
        (or leave the innermost section when None)."""
        now = self._now()
        top = self._stack[-1]
        self._seconds[top] = self._seconds.get(top, 0.0) + (now - self._last)
        self._last = now
        if push is None:
            self._stack.pop()
        else:
            self._stack.append(push)

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Time the block as ``name``; nested sections take their time out of this one."""
        if not name:
            raise ValueError("a section needs a name")
        if self._end is not None:
            raise RuntimeError("the timer was stopped")
        self._switch(name)
        try:
            if self._wrap is None:
                yield
            else:
                with self._wrap(name):
                    yield
        finally:
            self._switch(None)

    def stop(self) -> float:
        """End the timed span (idempotent); returns its length in seconds."""
        if self._end is None:
            if len(self._stack) != 1:
                raise RuntimeError(f"stop() inside section {self._stack[-1]!r}")
            now = self._now()
            self._seconds[""] = self._seconds.get("", 0.0) + (now - self._last)
            self._last = self._end = now
        return self._end - self._start

    @property
    def total(self) -> float:
        """Seconds from the start to ``stop`` (or to now while running)."""
        return (self._end if self._end is not None else self._clock()) - self._start

    def seconds(self) -> dict[str, float]:
        """Exclusive seconds per section name so far ("" is outside every section)."""
        return dict(self._seconds)

    def metrics(self, names: Sequence[str] = STEP_SECTIONS, prefix: str = "time/"
                ) -> dict[str, float]:
        """``prefix + name`` for every listed section (0.0 when it never ran); a listed name
        that is also a parent of listed names reports as ``name/other``; the time outside every
        section as ``other`` and the whole as ``step``. Sections not listed count as ``other``.
        Call after ``stop`` for figures that add up exactly."""
        listed = set(names)
        parents = {n.rsplit("/", 1)[0] for n in names if "/" in n}
        out: dict[str, float] = {}
        rest = 0.0
        for name, sec in self._seconds.items():
            if name not in listed:
                rest += sec
        for name in names:
            key = f"{name}/other" if name in parents else name
            out[prefix + key] = self._seconds.get(name, 0.0)
        out[prefix + "other"] = rest
        out[prefix + "step"] = self.total
        return out


class NullTimer:
    """A timer that times nothing (the default of functions that take one)."""

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        yield


Timer = StepTimer | NullTimer
NULL_TIMER = NullTimer()


def shares(rows: Sequence[dict[str, float]], prefix: str = "time/"
           ) -> tuple[float, dict[str, float]]:
    """Mean seconds per step of ``rows`` (metrics records) and each section's share of the total
    time (sections in first-seen order; the whole, ``time/step``, left out)."""
    timed = [r for r in rows if isinstance(r.get(prefix + "step"), int | float)]
    if not timed:
        return 0.0, {}
    total = sum(r[prefix + "step"] for r in timed)
    names: dict[str, float] = {}
    for r in timed:
        for k, v in r.items():
            if k.startswith(prefix) and k != prefix + "step" and isinstance(v, int | float):
                names[k[len(prefix):]] = names.get(k[len(prefix):], 0.0) + v
    share = {k: (v / total if total > 0 else 0.0) for k, v in names.items()}
    return total / len(timed), share


__all__ = ["NULL_TIMER", "STEP_SECTIONS", "NullTimer", "StepTimer", "Timer", "shares"]
