"""How a command stops when it is told to: Ctrl-C, SIGTERM and SIGHUP take one path.

    with stop_signals() as stop:          # a command line's main, in the main thread
        ...                               # each of the three raises Stopped (a KeyboardInterrupt)
    stop.signum, stop.written             # which came (None: none), outputs complete before it
    print(stopped_line("envace-audit", stop)); return stop.exit_code

    with signals_held():                  # steps that must not be cut in two (an output's commit)
        ...                               # a signal that comes now takes effect when they are done
    note_written(path)                    # after it: an output is complete and in place

Inside ``stop_signals`` a stop raises :class:`Stopped` wherever the command is, so the same
cleanup that Ctrl-C always ran (partial directories removed, locks released, workers killed) runs
for SIGTERM and SIGHUP too, and the command exits ``128 + signal`` (130, 143, 129) with one line;
a second stop while it stops is ignored, so that the cleanup is not cut short.
``stop.signum`` is set even when a library turned the interrupt into another error (a C
extension interrupted while it loads raises ImportError), so the command can still report it as
a stop. Outside the main thread, or where a signal is ignored (``nohup``, a background job),
nothing changes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["STOP_SIGNALS", "Stop", "Stopped", "ignore_stops", "note_written", "signals_held",
           "stop_signals", "stop_word", "stopped_line", "stopping"]

#: the signals that ask a command to stop
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """A stop signal arrived; ``signum`` says which (exit code ``128 + signum``)."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class Stop:
    """What :func:`stop_signals` saw: the signal (None: none) and the outputs complete before it."""

    signum: int | None = None
    written: list[Path] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)


_ACTIVE: list[Stop] = []


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _takes_over(signum: int) -> bool:
    """Whether the command's handler may replace this signal's: Python's own (Ctrl-C) or the
    default; never an ignored signal or a handler someone else installed."""
    old = signal.getsignal(signum)
    return old is signal.SIG_DFL or old is signal.default_int_handler


@contextlib.contextmanager
def stop_signals() -> Iterator[Stop]:
    """Within: each stop signal raises :class:`Stopped` and is recorded in the yielded
    :class:`Stop`; the handlers before are restored on leaving."""
    stop = Stop()
    if not _main_thread():
        yield stop
        return

    owner = os.getpid()
    old = {s: signal.getsignal(s) for s in STOP_SIGNALS if _takes_over(s)}

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a forked child (a worker, an environment): as before
            _as_before(signum, old[signum], frame)
            return
        if stop.signum is not None:  # already stopping: a second Ctrl-C must not cut the
            return  # cleanup short (SIGKILL still ends it; the next run clears what it left)
        stop.signum = signum
        raise Stopped(signum)

    _ACTIVE.append(stop)
    try:
        for s in old:
            signal.signal(s, handler)
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _ACTIVE.remove(stop)


def _as_before(signum: int, handler: Any, frame: Any) -> None:
    """What the signal did before it was taken over: Python's own handler (Ctrl-C raises
    KeyboardInterrupt), or the default action (the process ends by the signal)."""
    if callable(handler):
        handler(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Within: a stop signal is held; on leaving, the handlers before are restored and each held
    signal is delivered to them (a Python handler is called, the default action is raised)."""
    if not _main_thread():
        yield
        return
    held: list[int] = []
    old = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    old = {s: h for s, h in old.items() if h is not signal.SIG_IGN and h is not None}
    for s in old:
        signal.signal(s, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for s in dict.fromkeys(held):  # the first raises: Stopped, or KeyboardInterrupt
            _as_before(s, old[s], None)


def note_written(path: Path) -> None:
    """``path`` is complete and in place: a stop after this point leaves it so."""
    for stop in _ACTIVE:
        stop.written.append(path)


def stopping() -> int | None:
    """The stop signal that came within the innermost :func:`stop_signals`, or None."""
    return _ACTIVE[-1].signum if _ACTIVE else None


_WHAT = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated (SIGTERM)",
         signal.SIGHUP: "hung up (SIGHUP)"}


def stop_word(signum: int | None) -> str:
    """What stopped a command, in a word or three: ``interrupted`` for Ctrl-C (or none known)."""
    return _WHAT.get(signum or signal.SIGINT, "stopped")


def stopped_line(prog: str, stop: Stop) -> str:
    """The one line a stopped command prints: what stopped it and what it left."""
    what = stop_word(stop.signum)
    if stop.written:
        return (f"{prog}: {what} after its output was complete: "
                + ", ".join(str(p) for p in stop.written))
    return f"{prog}: {what}; nothing written (an earlier output is unchanged)"


def ignore_stops() -> None:
    """A command that has finished and is only exiting: a stop now must not turn its exit code
    into a signal's (call it only where the process ends next, never in a library)."""
    if _main_thread():
        for s in STOP_SIGNALS:
            if _takes_over(s):
                signal.signal(s, signal.SIG_IGN)
