"""Batches sent ahead to a guarded environment's process: a queue in its pipe.

The audit sends the next trajectories' resets and calls (``begin_batch`` messages) while it
scores this one's, so the environment's process runs them meanwhile. Up to :data:`MAX_AHEAD`
wait, at most :data:`AHEAD_BYTES` of them unread by the child beyond the first, so that neither
process can block the other on a full pipe. They are answered in the order sent; any other
request first reads every waiting answer (kept in the batch, ``buffer``); a batch read early
and taken after later batches ran marks the child stale, and the next request first brings the
child back to that batch's state (its reset and calls replayed in a fresh child). A batch whose
child was killed before it was read is sent again when taken.

:class:`AheadQueue` is the part of :class:`envace.core.envs.guard.GuardedEnv` that does this
(a mixin: it uses the environment's pipe, ``_answers``, ``begin_many`` and its restore state).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

from envace.core.envs.base import ToolResult

#: batches (trajectories) that may wait in the child's queue, sent ahead of their turn
MAX_AHEAD = 8
#: bytes of batches sent ahead that the child may not have read yet, beyond the first: far
#: below a pipe's capacity (64 KiB), so a send ahead never blocks while the child, busy, waits
#: for this side to read its answers
AHEAD_BYTES = 32 * 1024


@dataclass(eq=False)
class SentAhead:
    """A reset and its calls sent to the environment's process, not yet read
    (:meth:`GuardedEnv.send_ahead`); ``buffer``: their results once read early; ``size``: the
    message's bytes."""

    env: Any
    op: str
    target: Any
    calls: list[tuple[str, Any]]
    track: bool
    buffer: list[ToolResult] | None = None
    error: BaseException | None = None
    size: int = 0
    #: read early: what the environment knew after it (reset, calls, what the reset answered)
    context: tuple[Any, ...] | None = None
    #: the caller's own (the audit keeps the trajectory's checked steps here)
    note: Any = None
    #: the tools whose kinds the child sends after the batch
    tools: tuple[Any, ...] = ()
    seq: int = 0  # its number, from 1, in the order sent


class AheadQueue:
    """The queue of batches sent ahead (see the module docstring); mixed into GuardedEnv."""

    _ahead: deque[SentAhead]
    _conn: Any
    _proc: Any

    _kinds: dict[Any, Any]

    def _init_queue(self) -> None:
        #: resets and their calls sent, not yet answered, in the order sent
        self._ahead: deque[SentAhead] = deque()
        self._sent = 0  # batches sent ahead so far (their numbers)
        self._stale = False  # the child ran past the batch taken: restore before asking
        self._drop_queue()

    def _drop_queue(self) -> None:
        """Forget what was sent: its answers died with the child (taken, it is sent again)."""
        self._ahead.clear()
        self._ahead_bytes = 0  # the waiting messages' bytes (see AHEAD_BYTES)
        #: the number of the batch whose answers were read last (0: not one sent ahead): the
        #: child's state is where that batch left it (a number, not the batch: the batch
        #: refers to this object, and a cycle would keep the child alive until a collection)
        self._last_read = 0

    def _kinds_wanted(self, tools: Sequence[Any]) -> tuple[Any, ...]:
        """Those of ``tools`` whose kind is not known yet, once each: the child sends their
        kinds after the batch (a tool that cannot be a key is asked the plain way)."""
        out: dict[Any, None] = {}
        for tool in tools:
            try:
                if tool not in self._kinds:
                    out[tool] = None
            except TypeError:
                continue
        return tuple(out)

    def can_send_ahead(self) -> bool:
        """Whether :meth:`send_ahead` may send now (a child, room in the queue), so that a
        caller need not build a batch that would not go (the audit's next trajectory's
        calls: issue 44, half its attempts met a full queue)."""
        return self._proc is not None and len(self._ahead) < MAX_AHEAD

    def send_ahead(self, op: str, target: Any, calls: Sequence[tuple[str, Any]],
                   track_state: bool = False, tools: Sequence[Any] = ()
                   ) -> SentAhead | None:
        """:meth:`begin_many`'s message sent now, answered when :meth:`take_ahead` asks: the
        environment's process runs the next trajectory's calls while the audit scores this
        one's. Any other request first reads these answers (nothing is ever answered out of
        order); each call's limit counts from when its answer is awaited. Several may be
        ahead (:data:`MAX_AHEAD`), taken in the order sent. None: nothing was sent (no calls,
        no child, the queue full, or the message past what the child's pipe surely holds
        while it is busy: :data:`AHEAD_BYTES`)."""
        calls = list(calls)
        if not calls or self._proc is None or len(self._ahead) >= MAX_AHEAD:
            return None
        tools = self._kinds_wanted(tools)
        try:
            data = ForkingPickler.dumps(("begin_batch", op, target, calls, track_state, tools))
        except Exception:  # noqa: BLE001 - what cannot be pickled is asked the plain way
            return None
        if self._ahead and self._ahead_bytes + len(data) > AHEAD_BYTES:
            return None  # the child is busy: this could fill its pipe
        try:
            self._conn.send_bytes(data)  # the wire format of send(): the child's recv() reads it
        except (OSError, BrokenPipeError):
            return None
        self._sent += 1
        ahead = SentAhead(self, op, target, calls, track_state, size=len(data), tools=tools,
                          seq=self._sent)
        self._ahead.append(ahead)
        self._ahead_bytes += ahead.size
        return ahead

    def _pop_ahead(self) -> SentAhead:
        """The oldest batch sent ahead, whose answers are read next."""
        ahead = self._ahead.popleft()
        self._ahead_bytes -= ahead.size
        return ahead

    def take_ahead(self, ahead: SentAhead) -> Iterator[ToolResult]:
        """The results of what :meth:`send_ahead` sent, as :meth:`begin_many` returns them
        (the reset raising here if it failed)."""
        if ahead.buffer is not None:  # read already, when another request came first
            if ahead.error is not None:
                raise ahead.error
            if ahead.context is not None:  # what came with its reset; its calls for a restore
                (self._reset_op, self._log, self._after_reset, self._lost,
                 self._lost_crashed) = ahead.context
                self._stale = ahead.seq != self._last_read  # later batches ran in the child
            return iter(ahead.buffer)
        while self._ahead and self._ahead[0] is not ahead and ahead in self._ahead:
            self._drain_one()  # taken out of order: the ones sent before it are read first
        if not self._ahead or self._ahead[0] is not ahead:  # its child was killed before it
            return self.begin_many(ahead.op, ahead.target, ahead.calls, ahead.track,
                                   ahead.tools)  # was read
        self._pop_ahead()
        return self._answers(ahead.op, ahead.target, ahead.calls, ahead.track, ahead)

    def _drain(self) -> None:
        """Read every answer of the batches sent ahead into them (a request came first)."""
        while self._ahead:
            self._drain_one()

    def _drain_one(self) -> None:
        ahead = self._pop_ahead()
        try:
            ahead.buffer = list(self._answers(ahead.op, ahead.target, ahead.calls, ahead.track,
                                              ahead))
        except Exception as exc:  # the reset failed (it may have changed the state, as a later
            ahead.buffer, ahead.error = [], exc  # batch does): take_ahead raises it
            return
        ahead.context = (self._reset_op, list(self._log), dict(self._after_reset), self._lost,
                         self._lost_crashed)
