"""Which steps an audit's statistics count, and their depth.

A trajectory may hold two kinds of tool responses: *rehearsed* ones (``"rehearsed": true``,
written by the policy or a simulator) and *real* ones (``"rehearsed": false``: per-turn tasks
carry the earlier turns' ground-truth calls as real history). Fidelity is a property of the
rehearsed responses only, so every statistic of an audit is computed over the answered rehearsed
steps, with **depth** counted from each trajectory's first rehearsed step (depth 0). A response
without the flag (a file written by another simulator) counts as rehearsed; the summary says how
many were unmarked. Real steps stay in ``steps.jsonl`` and are summarised on their own as a
determinism check (they must never diverge). A file of real responses only audits as a
determinism check: its statistics are over the real steps, depth counted from the first call.

    assign_depths(records)            # one trajectory's step records, in call order: adds "depth"
    pop = population(rows)            # rows of a whole audit -> Population
    pop.rows, pop.kind                # the steps every statistic counts; "rehearsed" | ...
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

REHEARSED = "rehearsed"
DETERMINISM = "determinism_check"
EMPTY = "empty"


def is_rehearsed(row: dict[str, Any]) -> bool:
    """A step whose response was written by a world model (unmarked counts as rehearsed)."""
    return row.get("source_rehearsed") is not False


def _answered(row: dict[str, Any]) -> bool:
    return not row.get("unanswered")


def assign_depths(records: Iterable[dict[str, Any]]) -> None:
    """Set ``depth`` on one trajectory's step records (in call order), in place.

    Depth is the index among the trajectory's answered rehearsed steps; None for a real or an
    unanswered step.
    """
    d = 0
    for r in records:
        if _answered(r) and is_rehearsed(r):
            r["depth"] = d
            d += 1
        else:
            r["depth"] = None


def _by_trajectory(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[str(r.get("trajectory_id"))].append(r)
    return {t: sorted(g, key=lambda r: int(r.get("step") or 0)) for t, g in groups.items()}


@dataclass
class Population:
    """The steps every statistic counts (each with ``depth`` set) and what they are."""

    rows: list[dict[str, Any]]
    kind: str  # "rehearsed", "determinism_check" (real responses only) or "empty"
    counts: dict[str, int] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """The ``statistics`` block of ``summary.json``."""
        what = {
            REHEARSED: "rehearsed steps only (real history steps are the determinism check)",
            DETERMINISM: "DETERMINISM CHECK: this file holds real responses only, so the "
                         "statistics are over the real steps and must show no divergence",
            EMPTY: "no answered step",
        }[self.kind]
        return {
            "population": self.kind,
            "over": what,
            "depth": ("index among the trajectory's answered rehearsed steps (0 = its first "
                      "rehearsed step)") if self.kind != DETERMINISM else
                     "index among the trajectory's answered calls",
            "steps": len(self.rows),
            "trajectories": len({str(r.get("trajectory_id")) for r in self.rows}),
            **self.counts,
        }


def population(rows: Iterable[dict[str, Any]]) -> Population:
    """The statistics' steps of an audit: answered rehearsed steps, else (real only) real ones.

    Rows keep their stored ``depth`` when every row has the key (steps.jsonl written since the
    field exists); otherwise depth is derived per trajectory from ``step`` order (older files).
    Returned rows are copies; the input is not changed.
    """
    answered = [dict(r) for r in rows if _answered(r)]
    marked = sum(r.get("source_rehearsed") is True for r in answered)
    unmarked = sum(r.get("source_rehearsed") is None for r in answered)
    real = sum(r.get("source_rehearsed") is False for r in answered)
    counts = {"rehearsed_steps": marked, "unmarked_steps_counted_as_rehearsed": unmarked,
              "real_steps_excluded": real}
    if marked + unmarked:
        if not all("depth" in r for r in answered):
            for group in _by_trajectory(answered).values():
                assign_depths(group)
        chosen = [r for r in answered if is_rehearsed(r)]
        return Population(chosen, REHEARSED, counts)
    if real:
        for group in _by_trajectory(answered).values():
            for d, r in enumerate(group):
                r["depth"] = d
        return Population(answered, DETERMINISM, {**counts, "real_steps_excluded": 0})
    return Population([], EMPTY, counts)
