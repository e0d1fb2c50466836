"""How a call changed the real state: the leaves of an environment's ``state()`` that differ.

    change = diff_states(before, after)       # pure: two JSON-able states
    change.leaves, change.paths               # 2, ["files.notes.txt", "cwd"]
    change.bucket                             # "2" (strata 0, 1, 2, 3+)

    tracker = StateTracker(env)               # one environment's calls, state read once per call
    result = tracker.execute("cd", {"folder": "docs"})
    result.state_change                       # {"leaves": 1, "paths": ["cwd"]}, or None

A *leaf* is a value that is neither an object nor an array, at a path such as
``db.reservations.ABC123.status`` or ``files.todo[2]``. A leaf counts as changed when its value
differs; a key or index present on one side only counts as one changed leaf at its path (a
record added or removed as a whole is one change, however many fields it holds), and so does a
value whose type changed (an object became a string). Arrays are compared index by index (an
element inserted at the front shifts the rest: each shifted index counts). Subtrees equal on
both sides are skipped with one C-level comparison, so a diff costs the size of what changed,
not of the state. Values compare as Python compares them (``1 == 1.0``), except that NaN
equals NaN here (a state that holds one is unchanged by a read).

Every family's ``state()`` is the input (BFCL's backend objects, AgentDojo's and τ²'s pydantic
databases, an MCP server's workdir files, a plugin's public attributes): the environment
contract's JSON-able state, nothing else. :class:`StateTracker` reads it once per call (the
state after one call is the state before the next) and once after a reset, so tracking costs
one ``state()`` per call (bench/results/state_change_cost.json).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from typing import Any

from envace.core.envs.base import ToolResult

#: at most this many changed paths are kept per call (``leaves`` still counts all of them)
MAX_PATHS = 20
#: a state deeper than this cannot be diffed: the change is unknown
MAX_DEPTH = 10_000
#: nor one whose diff walks more nodes than this
MAX_NODES = 1_000_000
#: the strata of the number of changed leaves
BUCKETS = ("0", "1", "2", "3+")
_PLAIN = re.compile(r'[^.\[\]"\\]+')


def bucket(leaves: int | None) -> str:
    """The stratum of a leaf count: ``0``, ``1``, ``2``, ``3+`` (``unknown`` for None)."""
    if leaves is None:
        return "unknown"
    return BUCKETS[min(int(leaves), 3)]


def key_path(prefix: str, key: str) -> str:
    """``prefix.key``; a key that is empty or holds ``.``, ``[``, ``]`` or a quote is written
    ``prefix["key"]`` (JSON-quoted), so every path names one place."""
    import json

    if _PLAIN.fullmatch(key):
        return f"{prefix}.{key}" if prefix else key
    return f"{prefix}[{json.dumps(key, ensure_ascii=False)}]"


@dataclass(frozen=True)
class StateChange:
    """The changed leaves of one call: how many, and the first :data:`MAX_PATHS` paths."""

    leaves: int
    paths: tuple[str, ...] = ()

    @property
    def bucket(self) -> str:
        return bucket(self.leaves)

    def record(self) -> dict[str, Any]:
        """The ``state_change`` field of a step row (docs/spec/trajectory.md)."""
        return {"leaves": self.leaves, "paths": list(self.paths)}


def _same(a: Any, b: Any) -> bool:
    try:
        if a == b:
            return True
    except (RecursionError, TypeError):
        return False
    return isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)


def diff_states(before: Any, after: Any, max_paths: int = MAX_PATHS) -> StateChange:
    """The leaves that differ between two JSON-able states (see the module docstring).

    Iterative: a state nested past :data:`MAX_DEPTH` or a walk past :data:`MAX_NODES` raises
    ValueError (the tracker records the change as unknown). A pair of containers met again (a
    cyclic state, or one object reached by two paths) is walked once. Container subtrees that
    hold NaN compare unequal at the C level and are walked, where NaN equals NaN."""
    count = nodes = 0
    paths: list[str] = []
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[str, Any, Any, int]] = [("", before, after, 0)]
    while stack:
        where, a, b, depth = stack.pop()
        nodes += 1
        if depth > MAX_DEPTH or nodes > MAX_NODES:
            raise ValueError("the state is nested too deeply or too large to diff")
        if isinstance(a, dict | list) and isinstance(b, dict | list):
            if (id(a), id(b)) in seen:
                continue
            seen.add((id(a), id(b)))
        if _same(a, b):
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str, reverse=True):
                p = key_path(where, str(k))
                if k not in a or k not in b:
                    count += 1
                    if len(paths) < max_paths:
                        paths.append(p)
                else:
                    stack.append((p, a[k], b[k], depth + 1))
            continue
        if isinstance(a, list | tuple) and isinstance(b, list | tuple):
            for i in range(max(len(a), len(b)) - 1, -1, -1):
                p = f"{where}[{i}]"
                if i >= len(a) or i >= len(b):
                    count += 1
                    if len(paths) < max_paths:
                        paths.append(p)
                else:
                    stack.append((p, a[i], b[i], depth + 1))
            continue
        count += 1  # a leaf that changed, or a value whose type changed
        if len(paths) < max_paths:
            paths.append(where or "(state)")
    return StateChange(count, tuple(sorted(paths)))


@dataclass(frozen=True)
class TrackedResult(ToolResult):
    """A tool result with how the call changed the state (None: the state could not be read)."""

    state_change: dict[str, Any] | None = field(default=None, compare=False)


class StateTracker:
    """Executes calls on one environment and diffs its ``state()`` around each call.

    The state after a call is kept as the state before the next; :meth:`forget` drops it (call
    it after anything else that may change the state: a reset). A ``state()`` that raises makes
    that call's change unknown (None), never the call's failure."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self._last: Any = None
        self._known = False
        #: copy every state read: set once ``state()`` has returned the object it returned
        #: before (changed in place, it would always equal itself: no change ever seen)
        self._copy = False

    def forget(self) -> None:
        self._last, self._known = None, False

    def _state(self) -> tuple[bool, Any]:
        try:
            state = self.env.state()
            if self._known and state is self._last and not self._copy:
                self._copy = True  # the same object again: this call's change is unknown
                return False, copy.deepcopy(state)
            return True, copy.deepcopy(state) if self._copy else state
        except (Exception, SystemExit, KeyboardInterrupt):  # noqa: BLE001 - a plugin's state()
            return False, None  # that raises (even SystemExit) is an unknown change

    def execute(self, tool: str, arguments: Any) -> TrackedResult:
        if not self._known:
            self._known, self._last = self._state()
        known_before, before = self._known, self._last
        res = self.env.execute(tool, arguments)
        self._known, self._last = self._state()
        change = None
        if known_before and self._known:
            try:
                change = diff_states(before, self._last).record()
            except Exception:  # noqa: BLE001 - a state the diff cannot walk: unknown
                change = None
        return TrackedResult(res.content, res.error, getattr(res, "timeout", False),
                             state_change=change)
