"""A board cell's figures, read from its audit's ``summary.json`` (pure; no recomputation).

``exact`` and ``json_f1``: the mean score over the scored calls with the audit's cluster-
bootstrap interval; ``divergence``: the divergence rate and its interval; ``skill``: the exact
skill against the best reference of that environment (the audit's ``skill.by_scorer.exact``,
references built from the environment's train split); ``by_state_change`` and ``read_write``:
the same per stratum (``by_state_change`` and ``by_mutates_state`` blocks, skill from the
audit's per-stratum skill); ``bits_per_byte`` where the audit has a ``likelihood`` block;
``coverage_at_5pct`` and ``auroc`` where it has a ``confidence`` block; ``history_diff`` (own −
real divergence, paired) where it has a ``history`` block. Null where the block is absent.
"""

from __future__ import annotations

from typing import Any

from envace.core.board import Interval, Stratum


def _iv(point: Any, ci: Any) -> Interval:
    lo, hi = (ci if isinstance(ci, list | tuple) and len(ci) == 2 else (None, None))
    return Interval(point=point, lo=lo, hi=hi)


def _score(block: dict[str, Any], name: str) -> Interval:
    v = (block.get("scores") or {}).get(name) or {}
    return _iv(v.get("mean"), v.get("ci"))


def _skill(v: dict[str, Any] | None) -> Interval | None:
    if not v:
        return None
    return Interval(point=v.get("point"), lo=v.get("lo"), hi=v.get("hi"))


def _stratum(block: dict[str, Any], skill: dict[str, Any] | None) -> Stratum:
    return Stratum(n=block.get("n") or 0, exact=_score(block, "exact"),
                   divergence=_iv(block.get("divergence_rate"), block.get("divergence_ci")),
                   skill=_skill(skill))


def _bits_per_byte(s: dict[str, Any]) -> Interval | None:
    block = s.get("likelihood") or {}
    v = block.get("bits_per_byte")
    if isinstance(v, dict):  # {point, ci} (envace probe --likelihood), or {point, lo, hi}
        ci = v.get("ci")
        lo, hi = (ci if isinstance(ci, list | tuple) and len(ci) == 2
                  else (v.get("lo"), v.get("hi")))
        return Interval(point=v.get("point", v.get("mean")), lo=lo, hi=hi)
    if isinstance(v, int | float):
        ci = block.get("bits_per_byte_ci")
        return _iv(v, ci)
    return None


def _confidence(s: dict[str, Any]) -> dict[str, Any]:
    block = s.get("confidence")
    if not isinstance(block, dict):
        return {"coverage_at_5pct": None, "auroc": None}
    at = ((block.get("coverage_at_risk") or {}).get("5%") or {}).get("coverage")
    a = block.get("auroc") or {}
    return {"coverage_at_5pct": at,
            "auroc": _iv(a.get("point"), a.get("ci")) if isinstance(a, dict) else None}


def _history_diff(s: dict[str, Any]) -> Interval | None:
    block = s.get("history")
    if not isinstance(block, dict):
        return None
    d = (block.get("overall") or {}).get("diff") or {}
    return _iv(d.get("diff"), d.get("ci"))


def cell_figures(s: dict[str, Any]) -> dict[str, Any]:
    """The :class:`envace.core.board.Cell` fields an audit summary gives."""
    c = s.get("counts") or {}
    calls, trajectories = c.get("scored_steps"), c.get("scored_trajectories")
    lik = s.get("likelihood") or {}
    if not calls and lik.get("steps"):  # scored by likelihood: every real response, none generated
        calls, trajectories = lik.get("steps"), lik.get("trajectories")
    sk = ((s.get("skill") or {}).get("by_scorer") or {}).get("exact") or {}
    state = s.get("by_state_change") or {}
    state_skill = {k: (v.get("skill") or {}).get("exact")
                   for k, v in (state.get("strata") or {}).items()}
    rw_skill = (((s.get("skill") or {}).get("by_mutates_state") or {}).get("exact")) or {}
    return {
        "audited_model": s.get("audited_model"),
        "calls": calls,
        "trajectories": trajectories,
        "exact": _score(s, "exact"),
        "json_f1": _score(s, "json_f1"),
        "divergence": _iv(s.get("divergence_rate"), s.get("divergence_ci")),
        "best_reference": sk.get("best_reference"),
        "skill": Interval(point=sk.get("point"), lo=sk.get("lo"), hi=sk.get("hi")),
        "by_state_change": {k: _stratum(v, state_skill.get(k))
                            for k, v in (state.get("strata") or {}).items()},
        "cliff": (state.get("cliff") or {}).get("present"),
        "read_write": {k: _stratum(v, rw_skill.get(k))
                       for k, v in (s.get("by_mutates_state") or {}).items()},
        "bits_per_byte": _bits_per_byte(s),
        **_confidence(s),
        "history_diff": _history_diff(s),
    }
