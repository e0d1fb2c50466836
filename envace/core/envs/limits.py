"""The limits every environment call runs under, and one call under them in a child process.

:class:`CallLimits` (wall-clock seconds, added memory) is what ``--call-timeout`` and
``--call-memory-mb`` set (:func:`limit_arg` reads them); :func:`limited_call` runs one function
in a forked child under them. The environment hosted in a child for a whole trajectory is
``guard.py``'s :class:`~envace.core.envs.guard.GuardedEnv`; the child's side is
``guard_child.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing as mp
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envace.core.envs.guard_child import run_once

#: Seconds one environment call may take (``--call-timeout``). Real BFCL and AgentDojo calls
#: take milliseconds; 30 s leaves room for a slow plugin and still ends a stall quickly.
DEFAULT_CALL_TIMEOUT_S = 30.0
#: Address space a call may add to the environment process (``--call-memory-mb``).
DEFAULT_MEMORY_MB = 4096


#: The largest value of either limit: 16,777,216 (seconds: 194 days; MiB: 16 TiB). Past it a
#: timeout overflows the pipe's wait and a memory limit the process's address space (a usage
#: error, not a failure of every call).
MAX_LIMIT = 2**24


def limit_arg(text: str) -> float:
    """The value of ``--call-timeout`` / ``--call-memory-mb`` (an argparse type): a finite
    number from 0 (no limit) to :data:`MAX_LIMIT`; anything else is a usage error (exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number >= 0 (0: no limit)")
    if value > MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"{text!r}: at most {MAX_LIMIT} (seconds or MiB)")
    return value


class CallTimeout(Exception):
    """A guarded call other than ``execute`` (reset, state, ...) ran past the limit."""


class EnvProcessDied(Exception):
    """The environment's process died during a call other than ``execute``."""


@dataclass(frozen=True)
class CallLimits:
    """The limits of every environment call: wall-clock seconds and added memory (MiB); None
    turns a limit off (both None: no child process at all)."""

    call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S
    memory_mb: int | None = DEFAULT_MEMORY_MB

    def __post_init__(self) -> None:
        if self.call_timeout_s is not None and not self.call_timeout_s > 0:
            raise ValueError(f"call timeout must be > 0 seconds, not {self.call_timeout_s}")
        if self.memory_mb is not None and self.memory_mb < 1:
            raise ValueError(f"call memory limit must be >= 1 MiB, not {self.memory_mb}")

    @property
    def off(self) -> bool:
        return self.call_timeout_s is None and self.memory_mb is None


def limited_call(fn: Any, args: Sequence[Any], limits: CallLimits | None = None) -> Any:
    """``fn(*args)`` in a forked child under ``limits`` (default :class:`CallLimits`): its value
    (it must pickle), the exception it raised, :class:`CallTimeout` past the wall-clock limit
    (the child is killed) or :class:`EnvProcessDied` when the child ended without an answer.
    For code that must hold its environments in one process (a verifier comparing backend
    objects); ``limits.off``: called here."""
    limits = limits if limits is not None else CallLimits()
    if limits.off:
        return fn(*args)
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=run_once, args=(theirs, fn, args, limits.memory_mb, os.getpid()),
                       daemon=True, name="envace-limited-call")
    proc.start()
    theirs.close()
    try:
        if not mine.poll(limits.call_timeout_s):
            raise CallTimeout(f"ran past the call limit of {limits.call_timeout_s:g} s")
        try:
            kind, value = mine.recv()
        except EOFError:
            proc.join(5)
            raise EnvProcessDied(f"the process ended without an answer "
                                 f"({exit_text(proc.exitcode)})") from None
    finally:
        if proc.is_alive():
            with contextlib.suppress(OSError):
                proc.kill()
        proc.join(5)
        mine.close()
    if kind == "raise":
        raise value
    return value


def exit_text(code: int | None) -> str:
    """How a process ended, in words: its exit code or the signal that killed it."""
    if code is None:
        return "exit status unknown"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"
