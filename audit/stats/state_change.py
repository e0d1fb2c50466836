"""``by_state_change`` of an audit's summary: fidelity by how many state leaves a call changed.

A call that leaves the real state as it was (a read, a refused write) is easy to rehearse; one
that changes several fields of the state at once is where simulators are reported to fail (the
*state-change cliff*). Each step row carries ``state_leaves`` (``envace.core.envs.statediff``,
the leaves of the environment's ``state()`` the real call changed); this block splits the
scored steps into the strata 0, 1, 2, 3+ (and ``unknown`` where the state could not be read)
and gives, per stratum, the divergence rate and each scorer's mean with intervals that resample
the audit's clusters (``audit.stats.compounding.group_stats``), and the skill against the best
reference with its cluster-bootstrap interval (``audit.worlds.reference.skill_with_ci``).

``cliff`` compares the divergence of the calls that changed two or more leaves with that of the
calls that changed none, paired by cluster (``audit.stats.intervals.ratio_difference``: one
resample of the clusters serves both strata): ``present`` is true when the interval of the
difference lies above 0, false when it does not, null when a side has no call.

``claims`` counts, per read and write call, the responses that claim success where the real
call failed and those that claim a failure where the real call succeeded (a write that errors
in reality but is rehearsed as done is how a simulator hides a broken plan).

Pure functions over compact rows (no texts); None when no row carries ``state_leaves`` (an
audit written before issue 43, or with state tracking off).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from audit.stats.depth_tables import group_stats
from audit.stats.intervals import IntervalSpec, cluster_codes, ratio_difference
from audit.stats.running import Table
from audit.stats.steps import clean
from audit.worlds.reference import skill_with_ci
from envace.core.envs.statediff import BUCKETS, bucket

FIELD = "state_leaves"
#: the strata the cliff compares: none changed against several changed
CLIFF_LOW, CLIFF_HIGH = ("0",), ("2", "3+")


def _cluster(r: Mapping[str, Any]) -> str:
    c = r.get("cluster")
    return str(r.get("trajectory_id") if c is None else c)


def stratum(row: Mapping[str, Any]) -> str:
    """``0``, ``1``, ``2``, ``3+`` or ``unknown`` (no ``state_leaves``)."""
    v = row.get(FIELD)
    return bucket(v if isinstance(v, int) and not isinstance(v, bool) else None)


def _order(label: str) -> int:
    return BUCKETS.index(label) if label in BUCKETS else len(BUCKETS)


def _cliff(rows: Sequence[Mapping[str, Any]], spec: IntervalSpec) -> dict[str, Any]:
    low = [stratum(r) in CLIFF_LOW for r in rows]
    high = [stratum(r) in CLIFF_HIGH for r in rows]
    if not any(low) or not any(high):
        return _cliff_from(None, sum(low), sum(high), spec)
    codes, ids = cluster_codes([_cluster(r) for r in rows])
    div = np.fromiter((bool(r["diverged"]) for r in rows), dtype=float, count=len(rows))
    c = len(ids)
    sides = []
    for mask in (np.asarray(low), np.asarray(high)):
        sums = np.bincount(codes, weights=np.where(mask, div, 0.0), minlength=c)[:, None]
        counts = np.bincount(codes, weights=mask.astype(float), minlength=c)[:, None]
        sides.append((sums, counts))
    return _cliff_from(sides, sum(low), sum(high), spec)


def _cliff_from(sides: list[tuple[np.ndarray, np.ndarray]] | None, n_low: int, n_high: int,
                spec: IntervalSpec) -> dict[str, Any]:
    """The ``cliff`` dict from each side's per-cluster (diverged, calls) columns, clusters in
    sorted order (``cluster_codes``)."""
    out: dict[str, Any] = {"low": list(CLIFF_LOW), "high": list(CLIFF_HIGH),
                           "n_low": n_low, "n_high": n_high, "low_rate": None,
                           "high_rate": None, "diff": None, "ci": None, "p_value": None,
                           "method": None, "present": None}
    if not n_low or not n_high or sides is None:
        out["note"] = "no call in one of the two strata: no comparison"
        return out
    d = ratio_difference(sides[0], sides[1], spec, paired=True)[0]
    out.update(low_rate=d["a"], high_rate=d["b"], diff=d["diff"], ci=d["ci"],
               p_value=d["p_value"], method=d["method"])
    if d["ci"] is not None:
        out["present"] = bool(d["ci"][0] > 0)
    return out


def _claim_kind(r: Mapping[str, Any]) -> str | None:
    """Which ``claims`` side a row counts on (None: neither, or an error flag unknown)."""
    if r.get("rehearsed_error") is None or r.get("actual_error") is None:
        return None
    flag = r.get("mutates_state")
    return "write" if flag is True else "read" if flag is False else None


def _claims(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    counts: Counter = Counter()
    for r in rows:
        _count_claim(counts, r)
    return _claims_from(counts)


def _count_claim(counts: Counter, r: Mapping[str, Any]) -> None:
    label = _claim_kind(r)
    if label is None:
        return
    counts[label, "calls"] += 1
    counts[label, "err"] += bool(r["actual_error"])
    counts[label, "ok_claim_err"] += bool(not r["rehearsed_error"] and r["actual_error"])
    counts[label, "err_claim_ok"] += bool(r["rehearsed_error"] and not r["actual_error"])


def _claims_from(counts: Counter) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label in ("write", "read"):
        calls, n_err = counts[label, "calls"], counts[label, "err"]
        ok_claim_err, err_claim_ok = counts[label, "ok_claim_err"], counts[label, "err_claim_ok"]
        out[label] = {
            "calls": calls,
            "real_errors": n_err,
            "claims_success_real_error": ok_claim_err,
            "claims_error_real_success": err_claim_ok,
            "claims_success_real_error_rate": ok_claim_err / n_err if n_err else None,
            "claims_error_real_success_rate": (err_claim_ok / (calls - n_err)
                                               if calls > n_err else None),
        }
    return out


def by_state_change(rows: Sequence[Mapping[str, Any]], scorers: Sequence[str],
                    spec: IntervalSpec, best_reference: Mapping[str, str] | None = None
                    ) -> dict[str, Any] | None:
    """The ``by_state_change`` block over scored rows (see the module docstring); None when no
    row carries ``state_leaves``. ``best_reference``: scorer -> the reference the skill is
    against (the summary's ``skill.by_scorer[s].best_reference``); rows need ``ref_scores``."""
    if not any(FIELD in r for r in rows):
        return None
    strata: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        strata[stratum(r)].append(r)
    table: dict[str, Any] = {}
    for label in sorted(strata, key=_order):
        members = strata[label]
        g = group_stats(members, scorers, spec)
        g["writes"] = sum(1 for r in members if r.get("mutates_state") is True)
        if best_reference:
            groups = [_cluster(r) for r in members]
            g["skill"] = {
                s: skill_with_ci([float((r.get("scores") or {}).get(s, np.nan)) for r in members],
                                 [float(((r.get("ref_scores") or {}).get(ref) or {})
                                        .get(s, np.nan)) for r in members],
                                 groups=groups, n_boot=spec.resamples, seed=spec.seed)
                for s, ref in best_reference.items()}
        table[label] = g
    return _block(table, _cliff(rows, spec), _claims(rows))


def _block(table: dict[str, Any], cliff: dict[str, Any], claims: dict[str, Any]
           ) -> dict[str, Any]:
    return clean({
        "strata": table,
        "buckets": [*BUCKETS, "unknown"],
        "cliff": cliff,
        "claims": claims,
        "question": "does fidelity fall off when a call changes several state leaves at once?",
    })  # type: ignore[return-value]


class StateChangeRunning:
    """:func:`by_state_change` (without skill: an audit with references is summarised from its
    rows) from running aggregates, one trajectory's rows at a time: per stratum a running
    table (``audit.stats.running.Table``, its own clusters, as ``group_stats`` draws them),
    per cluster the cliff's sums, the claims' counts. Flat memory at any number of calls."""

    def __init__(self, scorers: Sequence[str], spec: IntervalSpec) -> None:
        self.scorers, self.spec = list(scorers), spec
        self.tables: dict[str, Any] = {}
        self.writes: Counter = Counter()
        self.seen = False
        #: cluster -> [low diverged, low calls, high diverged, high calls]
        self.cliff: dict[str, list[float]] = {}
        self.n_low = self.n_high = 0
        self.claims: Counter = Counter()

    def add(self, rows: Sequence[dict[str, Any]]) -> None:
        """One trajectory's population rows, in order."""
        by: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            self.seen = self.seen or FIELD in r
            label = stratum(r)
            by[label].append(r)
            self.writes[label] += r.get("mutates_state") is True
            low, high = label in CLIFF_LOW, label in CLIFF_HIGH
            self.n_low += low
            self.n_high += high
            cell = self.cliff.setdefault(_cluster(r), [0.0, 0.0, 0.0, 0.0])
            div = float(bool(r["diverged"]))
            if low:
                cell[0] += div
                cell[1] += 1.0
            if high:
                cell[2] += div
                cell[3] += 1.0
            _count_claim(self.claims, r)
        for label, members in by.items():
            if label not in self.tables:
                self.tables[label] = Table(self.scorers, self.spec, overall_only=True)
            self.tables[label].add_trajectory(members)

    def result(self) -> dict[str, Any] | None:
        if not self.seen:
            return None
        table: dict[str, Any] = {}
        for label in sorted(self.tables, key=_order):
            t = self.tables[label]
            t.close()
            g = t.stats(("all", None))
            g["writes"] = self.writes[label]
            table[label] = g
        sides = None
        if self.n_low and self.n_high:
            cells = np.array([self.cliff[c] for c in sorted(self.cliff)], dtype=float)
            sides = [(cells[:, [0]], cells[:, [1]]), (cells[:, [2]], cells[:, [3]])]
        return _block(table, _cliff_from(sides, self.n_low, self.n_high, self.spec),
                      _claims_from(self.claims))


def cliff_line(block: Mapping[str, Any] | None) -> str | None:
    """One sentence for the report: whether the audit shows a state-change cliff."""
    if not block:
        return None
    c = block.get("cliff") or {}
    if c.get("present") is None:
        return ("State-change cliff: not assessable (no call changed "
                + ("none" if not c.get("n_low") else "two or more") + " state leaves).")
    ci = c.get("ci") or [None, None]
    text = (f"divergence {c['low_rate']:.1%} on calls that changed no state leaf (n={c['n_low']})"
            f" vs {c['high_rate']:.1%} on calls that changed two or more (n={c['n_high']}); "
            f"difference {c['diff']:+.1%} [{ci[0]:+.1%}, {ci[1]:+.1%}]")
    return ("State-change cliff: **yes**, " if c["present"] else "State-change cliff: no, ") + text


def _pct(x: Any) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _interval(ci: Any, pct: bool = True) -> str:
    if not ci or ci[0] is None or ci[1] is None:
        return ""
    f = _pct if pct else (lambda v: f"{v:.3f}")
    return f" [{f(ci[0])}, {f(ci[1])}]"


def report_lines(block: Mapping[str, Any] | None, verdict: str | None = None) -> list[str]:
    """The report's section on the state change (none when the audit has no block)."""
    if not block:
        return []
    lines = ["", "## By state change (leaves of the real state the call changed)", "",
             cliff_line(block) or "", "",
             "| leaves changed | steps | writes | divergence | 95% CI | skill | 95% CI |",
             "|---|---|---|---|---|---|---|"]
    for label, v in (block.get("strata") or {}).items():
        sk = (v.get("skill") or {})
        one = sk.get(verdict) if verdict in sk else next(iter(sk.values()), None)
        skill_text = ("—", "") if not one else (
            "n/a" if one.get("point") is None else f"{one['point']:.3f}",
            _interval([one.get("lo"), one.get("hi")], False))
        lines.append(f"| {label} | {v['n']} | {v.get('writes', '')} | "
                     f"{_pct(v.get('divergence_rate'))} |{_interval(v.get('divergence_ci'))} | "
                     f"{skill_text[0]} |{skill_text[1]} |")
    w = (block.get("claims") or {}).get("write") or {}
    if w.get("calls"):
        lines += ["", f"Write calls: {w['calls']}, {w['real_errors']} failed in reality; "
                  f"{w['claims_success_real_error']} of those were rehearsed as a success, and "
                  f"{w['claims_error_real_success']} real successes were rehearsed as a failure."]
    return lines
