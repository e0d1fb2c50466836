"""How a command stops when it is told to: Ctrl-C, SIGTERM and SIGHUP take one path.

    return run_command("envace-audit", lambda: _main(argv), final=argv is None)   # a CLI's main
    with stop_signals() as stop:          # what it runs the command in (main thread)
        ...                               # each of the three raises Stopped (a KeyboardInterrupt)
    stop.signum, stop.written             # which came (None: none), outputs complete before it

    with signals_held():                  # steps that must not be cut in two (an output's commit)
        ...                               # a signal that comes now takes effect when they are done
    note_written(path)                    # after it: an output is complete and in place

Inside ``stop_signals`` a stop raises :class:`Stopped` wherever the command is, so the same
cleanup that Ctrl-C always ran (partial directories removed, locks released, workers killed) runs
for SIGTERM and SIGHUP too, and the command exits ``128 + signal`` (130, 143, 129) with one line;
a second stop while it stops is ignored, so that the cleanup is not cut short (a third ends the
process as the signal did before). A stop that something swallowed (a close that waits) is still
the command's end: ``stop.signum`` is checked when the command returns.
``stop.signum`` is set even when a library turned the interrupt into another error (a C
extension interrupted while it loads raises ImportError), so the command can still report it as
a stop. Outside the main thread, or where a signal is ignored (``nohup``, a background job),
nothing changes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["STOP_SIGNALS", "Stop", "Stopped", "note_written", "run_command", "say", "say_stopped",
           "signals_held", "stop_signals", "stop_word", "stopped_line", "stopping"]

#: the signals that ask a command to stop
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """A stop signal arrived; ``signum`` says which (exit code ``128 + signum``)."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    def __reduce__(self) -> tuple[Any, ...]:  # pickled (a Ray task) and copied by its number
        return (Stopped, (self.signum,))


@dataclass
class Stop:
    """What :func:`stop_signals` saw: the signal (None: none) and the outputs complete before it."""

    signum: int | None = None
    written: list[Path] = field(default_factory=list)
    count: int = 0  #: stops received (a third ends the process as the signal did before)

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)


_ACTIVE: list[Stop] = []
#: the dispositions a forked child gets back at once (``os.register_at_fork``): a worker or an
#: environment stuck in C code still ends on SIGTERM as before, not at its next bytecode
_BEFORE: dict[int, Any] = {}


def _child_defaults() -> None:
    with contextlib.suppress(ValueError, OSError):
        for s, h in _BEFORE.items():
            signal.signal(s, h)
    _BEFORE.clear()
    _ACTIVE.clear()


os.register_at_fork(after_in_child=_child_defaults)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _takes_over(signum: int) -> bool:
    """Whether the command's handler may replace this signal's: Python's own (Ctrl-C) or the
    default; never an ignored signal or a handler someone else installed."""
    old = signal.getsignal(signum)
    return old is signal.SIG_DFL or old is signal.default_int_handler


@contextlib.contextmanager
def _blocked() -> Iterator[None]:
    """Stop signals held by the kernel while handlers are swapped (none lands between two)."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@contextlib.contextmanager
def stop_signals(final: bool = False) -> Iterator[Stop]:
    """Within: each stop signal raises :class:`Stopped` and is recorded in the yielded
    :class:`Stop`; a second while stopping is ignored (the cleanup is not cut short), a third
    does what the signal did before. On leaving, the handlers before are restored, or with
    ``final`` (a command line's own process, about to exit: its code is decided) the signals
    are ignored from then on."""
    stop = Stop()
    if not _main_thread():
        yield stop
        return
    owner = os.getpid()
    old = {s: signal.getsignal(s) for s in STOP_SIGNALS if _takes_over(s)}
    closing = False

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a forked child (a backstop to _child_defaults): as before
            _as_before(signum, old[signum], frame)
            return
        stop.count += 1
        if stop.count >= 3 and not closing:
            _as_before(signum, old[signum], frame)
            return
        if stop.signum is not None or closing:  # stopping already, or done: recorded only
            stop.signum = stop.signum or signum
            return
        stop.signum = signum
        raise Stopped(signum)

    with _blocked():
        outer = not _BEFORE
        if outer:
            _BEFORE.update(old)
        _ACTIVE.append(stop)
        for s in old:
            signal.signal(s, handler)
    try:
        yield stop
    finally:
        closing = True
        with _blocked():
            for s, h in old.items():
                signal.signal(s, signal.SIG_IGN if final else h)
            _ACTIVE.remove(stop)
            if outer:
                _BEFORE.clear()


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
    with _blocked():
        old = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        old = {s: h for s, h in old.items() if h is not signal.SIG_IGN and h is not None}
        for s in old:
            signal.signal(s, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        with _blocked():
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


def stopped_line(prog: str, stop: Stop, atomic: bool = True) -> str:
    """The one line a stopped command prints: what stopped it and what it left (``atomic``: a
    command whose outputs are all renamed into place when complete says that none was)."""
    what = stop_word(stop.signum)
    if stop.written:
        return (f"{prog}: {what} after its output was complete: "
                + ", ".join(str(p) for p in stop.written))
    return f"{prog}: {what}; nothing written (an earlier output is unchanged)" if atomic else \
        f"{prog}: {what}"


def say(line: str) -> None:
    """One line to stderr; a hung-up terminal refuses it, and that must not change the exit."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def say_stopped(prog: str, stop: Stop, atomic: bool = True) -> int:
    """Print :func:`stopped_line` (:func:`say`) and return the stop's exit code."""
    say(stopped_line(prog, stop, atomic))
    return stop.exit_code


def run_command(prog: str, body: Callable[[], int], final: bool, atomic: bool = True) -> int:
    """A command line's main: ``body()`` within :func:`stop_signals` (``final``: this process
    exits next), its exit code, or, when a stop came, the stop's with its one line (unless the
    command printed its own and returned that code). An error raised after a stop is the stop
    (a C extension interrupted while it loads raises ImportError), and so is a stop something
    swallowed."""
    try:
        with stop_signals(final=final) as stop:
            try:
                rc: int | None = body()
            except KeyboardInterrupt:
                rc = None
            except Exception:
                if stop.signum is None:
                    raise
                rc = None
            if rc is None or (stop.signum is not None and rc != stop.exit_code):
                rc = say_stopped(prog, stop, atomic)
    except KeyboardInterrupt:  # a stop while the handlers were being put in place
        rc = say_stopped(prog, Stop(signal.SIGINT), atomic)
    return rc
