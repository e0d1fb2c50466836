"""Tests for audit.stats.history: the real-vs-own-history decomposition (known answers,
properties)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.stats.history import Pair, decompose, pair_verdicts
from audit.stats.intervals import IntervalSpec

SPEC = IntervalSpec(resamples=300, seed=0)


def _compounding_pairs(n_traj: int = 10, length: int = 5, hard: int = 1) -> list[Pair]:
    """A world model right with the real history except at one hard step (`hard`), and, with
    its own history, wrong from its first mistake on (it degrades only after its own error)."""
    return [Pair(f"t{t}", s, s, real=(s == hard), own=(s >= hard), write=s % 2 == 0,
                 novelty=0.1)
            for t in range(n_traj) for s in range(length)]


def test_known_answer_induced_errors():
    block = decompose(_compounding_pairs(), SPEC)
    o = block["overall"]
    # 10 trajectories x 5 steps; real wrong once per trajectory, own wrong at steps 1..4
    assert o["n"] == 50 and o["trajectories"] == 10
    assert o["real"]["point"] == pytest.approx(10 / 50)
    assert o["own"]["point"] == pytest.approx(40 / 50)
    assert o["diff"]["diff"] == pytest.approx(30 / 50)
    # 30 of the 40 own-history divergences fall on steps right with the real history
    assert o["induced"]["count"] == 30 and o["induced"]["point"] == pytest.approx(0.75)
    assert o["recovered"]["count"] == 0 and o["recovered"]["point"] == 0.0
    rows = {r["depth"]: r for r in block["by_depth"]}
    assert rows[0]["own"]["point"] == 0.0 and rows[0]["diff"]["diff"] == 0.0
    assert rows[1]["real"]["point"] == 1.0 and rows[1]["own"]["point"] == 1.0
    for d in (2, 3, 4):  # difficulty says 0, own history says 1: all compounding
        assert rows[d]["real"]["point"] == 0.0 and rows[d]["own"]["point"] == 1.0
        assert rows[d]["induced"]["point"] == 1.0
    assert block["deep"]["n"] == 20 and block["deep"]["compounding_share"]["point"] == 1.0
    assert block["compounding_share"]["point"] == pytest.approx(0.75)


def test_history_that_does_not_matter_shows_no_difference():
    pairs = [Pair(f"t{t}", s, s, real=(t + s) % 3 == 0, own=(t + s) % 3 == 0)
             for t in range(8) for s in range(6)]
    block = decompose(pairs, SPEC)
    for g in [block["overall"], block["deep"], *block["by_depth"]]:
        assert g["diff"]["diff"] == 0.0
        assert g["induced"]["count"] == 0 and g["recovered"]["count"] == 0
        lo, hi = g["diff"]["ci"]
        assert lo <= 0.0 <= hi
    assert block["compounding_share"]["point"] == 0.0


def test_groups_by_kind_and_novelty():
    pairs = [Pair("a", 0, 0, True, True, write=True, novelty=0.9),
             Pair("a", 1, 1, False, True, write=False, novelty=0.1),
             Pair("b", 0, 0, False, False, write=None, novelty=None)]
    block = decompose(pairs, SPEC)
    assert set(block["by_mutates_state"]) == {"read", "write", "unknown"}
    assert block["by_mutates_state"]["read"]["induced"]["count"] == 1
    assert set(block["by_novelty"]) == {"0.75-1.00", "0.00-0.25", "unknown"}


def test_pair_verdicts_pairs_by_step_and_drops_unusable():
    real = [{"trajectory_id": "x", "step": s, "diverged": s == 2, "mutates_state": True,
             "novelty": 0.5} for s in range(4)]
    own = [{"trajectory_id": "x", "step": s, "diverged": s >= 1} for s in range(4)]
    own[1]["unanswered"] = True  # left out of both
    own.append({"trajectory_id": "y", "step": 0, "diverged": True})  # no real partner
    pairs = pair_verdicts(real, own)
    assert [(p.step, p.depth, p.real, p.own) for p in pairs] == [
        (0, 0, False, False), (2, 1, True, True), (3, 2, False, True)]
    assert pairs[0].write is True and pairs[0].novelty == 0.5


def test_empty_is_honest():
    block = decompose([], SPEC)
    assert block["pairs"] == 0 and block["overall"] is None and block["by_depth"] == []
    assert block["compounding_share"]["point"] is None


pair_lists = st.lists(
    st.tuples(st.integers(0, 5), st.booleans(), st.booleans(),
              st.sampled_from([True, False, None])),
    min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(pair_lists)
def test_properties(raw):
    seen: dict[int, int] = {}
    pairs = []
    for t, r, o, w in raw:
        d = seen.get(t, 0)
        seen[t] = d + 1
        pairs.append(Pair(f"t{t}", d, d, r, o, write=w))
    block = decompose(pairs, IntervalSpec(resamples=50, seed=1))
    o = block["overall"]
    n = len(pairs)
    real, own = sum(p.real for p in pairs), sum(p.own for p in pairs)
    assert o["n"] == n and o["diverged_real"] == real and o["diverged_own"] == own
    assert o["diff"]["diff"] == pytest.approx((own - real) / n)
    # induced - recovered = own - real, counted
    assert o["induced"]["count"] - o["recovered"]["count"] == own - real
    assert sum(g["n"] for g in block["by_depth"]) == n
    assert sum(g["n"] for g in block["by_mutates_state"].values()) == n
    for g in [o, *block["by_depth"]]:
        for k in ("real", "own", "induced", "recovered"):
            p, ci = g[k]["point"], g[k]["ci"]
            if p is not None:
                assert 0.0 <= p <= 1.0
                assert ci is None or ci[0] - 1e-9 <= p <= ci[1] + 1e-9
    share = block["compounding_share"]["point"]
    if own:
        assert share == pytest.approx((own - real) / own)
