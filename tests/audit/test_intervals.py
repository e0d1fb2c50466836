"""Tests for audit.stats.intervals: the trajectory (cluster) bootstrap, known answers and
properties."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from audit.stats.depth_tables import by_depth, group_stats
from audit.stats.intervals import (
    BOOTSTRAP,
    NEWCOMBE_TRAJECTORIES,
    WILSON_TRAJECTORIES,
    IntervalSpec,
    cluster_codes,
    cluster_ratio,
    cluster_sums,
    ratio_difference,
    wilson_ci,
)
from audit.stats.summary import summarize

SPEC = IntervalSpec(resamples=400, seed=0)


def _flat(trajs: list[list[float]]) -> tuple[list[float], list[str]]:
    values = [v for t in trajs for v in t]
    groups = [f"t{i:04d}" for i, t in enumerate(trajs) for _ in t]
    return values, groups


# ------------------------------------------------------------------ known answers


def test_correlated_steps_step_wilson_undercovers_cluster_bootstrap_does_not():
    """Trajectories whose 8 steps all diverge or all match together (true rate 0.3): treating
    the 320 steps as independent, Wilson's interval covers the truth in about half of the
    replications; resampling trajectories covers it about 95 % of the time."""
    rng = np.random.default_rng(1)
    truth, n_traj, per_traj, reps = 0.3, 40, 8, 300
    wilson_hits = cluster_hits = 0
    for r in range(reps):
        bad = rng.random(n_traj) < truth
        values, groups = _flat([[float(b)] * per_traj for b in bad])
        lo, hi = wilson_ci(sum(values), len(values))
        wilson_hits += lo <= truth <= hi
        res = cluster_ratio(values, groups, IntervalSpec(resamples=400, seed=r))
        cluster_hits += res["ci"][0] <= truth <= res["ci"][1]
    assert wilson_hits / reps < 0.75  # far below the nominal 95 % (theory: about 50 %)
    assert 0.90 <= cluster_hits / reps <= 0.99


def test_independent_steps_cluster_bootstrap_covers_like_wilson():
    """One step per trajectory: the cluster bootstrap is the ordinary bootstrap and covers."""
    rng = np.random.default_rng(2)
    hits = 0
    for r in range(200):
        values = (rng.random(120) < 0.3).astype(float).tolist()
        res = cluster_ratio(values, list(range(120)), IntervalSpec(resamples=400, seed=r))
        hits += res["ci"][0] <= 0.3 <= res["ci"][1]
    assert 0.90 <= hits / 200 <= 0.99


def test_degenerate_rates_fall_back_to_wilson_on_trajectories():
    values, groups = _flat([[0.0] * 5 for _ in range(10)])  # 0 of 50 steps, 10 trajectories
    res = cluster_ratio(values, groups, SPEC)
    assert res["method"] == WILSON_TRAJECTORIES and res["point"] == 0.0
    assert res["ci"] == pytest.approx(list(wilson_ci(0, 10)), rel=1e-4)
    assert res["ci"][1] > wilson_ci(0, 50)[1]  # wider than a step-level Wilson interval
    res = cluster_ratio([1.0, 1.0, 1.0], ["a", "a", "b"], SPEC)  # all diverged
    assert res["method"] == WILSON_TRAJECTORIES
    assert res["ci"] == pytest.approx(list(wilson_ci(2, 2)), rel=1e-4)
    one = cluster_ratio([1.0, 0.0, 1.0], ["a", "a", "a"], SPEC)  # a single trajectory
    assert one["method"] == WILSON_TRAJECTORIES and one["trajectories"] == 1
    assert one["ci"][0] < 2 / 3 < one["ci"][1]
    assert cluster_ratio([], [], SPEC) == {"point": None, "ci": None, "method": None, "n": 0,
                                           "trajectories": 0, "mc_error": None}


def test_missing_scores_are_left_out_of_means():
    res = cluster_ratio([1.0, float("nan"), 0.0, 0.5], ["a", "a", "b", "b"], SPEC)
    assert res["point"] == pytest.approx(0.5) and res["n"] == 3


def test_group_stats_by_hand_and_seeded():
    steps = [{"trajectory_id": t, "step": i, "diverged": d, "scores": {"exact": 1.0 - d}}
             for t, flags in (("a", [1, 1]), ("b", [0, 0, 0]), ("c", [1, 0])) for i, d in
             enumerate(flags)]
    g = group_stats(steps, ["exact"], SPEC)
    assert (g["n"], g["trajectories"], g["diverged"]) == (7, 3, 3)
    assert g["divergence_rate"] == pytest.approx(3 / 7)
    assert g["scores"]["exact"]["mean"] == pytest.approx(4 / 7)
    assert g["divergence_ci_method"] == BOOTSTRAP
    assert g == group_stats(list(reversed(steps)), ["exact"], SPEC)  # seeded, order-free


def test_summarize_records_the_interval_method():
    steps = [{"trajectory_id": "a", "step": 0, "diverged": True, "scores": {}, "tool": "ls"},
             {"trajectory_id": "b", "step": 0, "diverged": False, "scores": {}, "tool": "ls"}]
    iv = summarize(steps, n_boot=50, logistic_boot=0)["interval"]
    assert (iv["method"], iv["resamples"], iv["seed"], iv["level"]) == (BOOTSTRAP, 50, 0, 0.95)


def test_by_depth_uses_depth_not_step():
    steps = [{"trajectory_id": "a", "step": 3, "depth": 0, "diverged": False, "scores": {}},
             {"trajectory_id": "a", "step": 4, "depth": 1, "diverged": True, "scores": {}}]
    assert [(r["depth"], r["divergence_rate"]) for r in by_depth(steps)] == [(0, 0.0), (1, 1.0)]


def test_difference_independent_and_paired():
    a = _flat([[1.0, 1.0], [0.0, 0.0], [0.0], [1.0, 0.0]])
    b = _flat([[0.0, 0.0], [0.0, 0.0], [0.0], [0.0, 0.0]])
    ca, ids = cluster_codes(a[1])
    cb, _ = cluster_codes(b[1])
    sa, sb = cluster_sums(ca, np.array(a[0])), cluster_sums(cb, np.array(b[0]))
    spec = IntervalSpec(resamples=2000, seed=0)
    for paired in (False, True):
        d = ratio_difference(sa, sb, spec, paired)[0]
        assert d["diff"] == pytest.approx(-3 / 7)
        assert d["ci"][0] <= d["diff"] <= d["ci"][1] and 0 < d["p_value"] <= 1
    same = ratio_difference(sb, sb, spec, paired=False)[0]  # 0 of n in both: no spread
    assert same["diff"] == 0 and same["method"] == NEWCOMBE_TRAJECTORIES
    assert same["ci"][0] < 0 < same["ci"][1] and same["p_value"] == 1.0


# ------------------------------------------------------------------ properties

trajectories = st.lists(st.lists(st.floats(0, 1), min_size=1, max_size=6), min_size=1,
                        max_size=15)
flag_trajectories = st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=6),
                             min_size=1, max_size=15)


@settings(max_examples=60, deadline=None)
@given(trajectories, st.integers(0, 3))
def test_interval_contains_the_point_and_lies_in_0_1(trajs, seed):
    values, groups = _flat(trajs)
    res = cluster_ratio(values, groups, IntervalSpec(resamples=100, seed=seed))
    lo, hi = res["ci"]
    assert 0.0 - 1e-12 <= lo <= res["point"] <= hi <= 1.0 + 1e-12
    assert res["point"] == pytest.approx(sum(values) / len(values))
    assert res["method"] in (BOOTSTRAP, WILSON_TRAJECTORIES)


@settings(max_examples=60, deadline=None)
@given(flag_trajectories, st.randoms(use_true_random=False))
def test_invariant_to_step_order_within_and_across_trajectories(trajs, rnd):
    values, groups = _flat(trajs)
    pairs = list(zip(values, groups, strict=True))
    rnd.shuffle(pairs)
    shuffled = cluster_ratio([v for v, _ in pairs], [g for _, g in pairs], SPEC)
    assert shuffled == cluster_ratio(values, groups, SPEC)


@settings(max_examples=40, deadline=None)
@given(flag_trajectories, st.integers(2, 4))
def test_repeating_every_step_within_its_trajectory_does_not_narrow_the_interval(trajs, m):
    """Dependent copies add no information: the step-level Wilson interval shrinks, this not."""
    values, groups = _flat(trajs)
    copies = _flat([[v for v in t for _ in range(m)] for t in trajs])
    once, many = cluster_ratio(values, groups, SPEC), cluster_ratio(*copies, SPEC)
    assert many["ci"] == pytest.approx(once["ci"])
    assert many["n"] == m * once["n"] and many["trajectories"] == once["trajectories"]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(0.01, 0.99), min_size=8, max_size=30), st.integers(0, 5))
@example(values=[0.5, 0.5, 0.5, 0.25, 0.25, 0.5, 0.25, 0.75], seed=0)
def test_one_step_per_trajectory_agrees_with_scipys_percentile_bootstrap(values, seed):
    """With one step per trajectory the cluster bootstrap is the ordinary bootstrap of the mean:
    its interval agrees with scipy's percentile bootstrap (an independent implementation, its
    own random draws) within the two Monte-Carlo errors."""
    from scipy.stats import bootstrap

    x = np.asarray(values)
    assume(np.ptp(x) > 0.05)  # no spread: no bootstrap (the Wilson fallback, tested above)
    spec = IntervalSpec(resamples=4000, seed=seed)
    res = cluster_ratio(values, [f"{i:05d}" for i in range(len(values))], spec)
    ref = bootstrap((x,), np.mean, n_resamples=4000, method="percentile", confidence_level=0.95,
                    random_state=seed + 100).confidence_interval
    assert res["method"] == BOOTSTRAP
    tol = 4 * x.std(ddof=1) / np.sqrt(len(x)) / np.sqrt(4000) * 5 + 1e-3
    # a mean of few repeated values lives on a lattice (here steps of 1/32): two bootstraps'
    # percentiles may land one step apart (found by hypothesis: 0.343 against scipy's 0.3125)
    gaps = np.diff(np.unique(x))
    tol += gaps.min() / len(x) if gaps.size else 0.0
    assert res["ci"][0] == pytest.approx(ref.low, abs=tol)
    assert res["ci"][1] == pytest.approx(ref.high, abs=tol)


@settings(max_examples=40, deadline=None)
@given(flag_trajectories, flag_trajectories, st.booleans())
def test_difference_interval_contains_the_difference(ta, tb, paired):
    if paired:
        tb = [[random.Random(i).choice([0.0, 1.0]) for _ in t] for i, t in enumerate(ta)]
    (va, ga), (vb, gb) = _flat(ta), _flat(tb)
    sa = cluster_sums(cluster_codes(ga)[0], np.array(va))
    sb = cluster_sums(cluster_codes(gb)[0], np.array(vb))
    d = ratio_difference(sa, sb, IntervalSpec(resamples=100, seed=0), paired)[0]
    assert d["diff"] == pytest.approx(sum(vb) / len(vb) - sum(va) / len(va))
    assert d["ci"][0] - 1e-12 <= d["diff"] <= d["ci"][1] + 1e-12
    assert 0 < d["p_value"] <= 1


def _steps(trajs: list[list[bool]], tools: str = "ab") -> list[dict]:
    return [{"trajectory_id": f"t{i}", "step": d + 2, "depth": d, "tool": tools[(i + d) % 2],
             "diverged": flag, "scores": {"exact": 0.0 if flag else 1.0}}
            for i, flags in enumerate(trajs) for d, flag in enumerate(flags)]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=1, max_size=5), min_size=1, max_size=10),
       st.randoms(use_true_random=False))
def test_summary_figures_contain_their_estimates_and_ignore_input_order(trajs, rnd):
    steps = _steps(trajs)
    out = summarize(steps, n_boot=60, logistic_boot=0)
    rows = [out, *out["by_depth"], *out["by_tool"].values()]
    for r in rows:
        lo, hi = r["divergence_ci"]
        assert 0.0 <= lo <= r["divergence_rate"] <= hi <= 1.0
        ex = r["scores"]["exact"]
        assert ex["ci"][0] <= ex["mean"] <= ex["ci"][1]
    shuffled = list(steps)
    rnd.shuffle(shuffled)
    again = summarize(shuffled, n_boot=60, logistic_boot=0)
    for key in ("divergence_ci", "scores", "by_depth", "by_tool", "first_divergence",
                "compounding"):
        assert again[key] == out[key], key


def test_a_rare_event_rate_is_never_narrower_than_wilson_with_the_effective_size():
    """1 of 150 independent steps: a percentile bootstrap alone reads about [0, 2 %] and misses
    the truth far more often than 5 %; the rate's interval contains Wilson's (n_eff = n here,
    one step per trajectory), and with clustered steps n_eff shrinks by the design effect."""
    from audit.stats.intervals import cluster_ratio, effective_size
    from audit.stats.intervals import wilson_ci as wilson

    values = [1.0] + [0.0] * 149
    r = cluster_ratio(values, list(range(150)))
    lo, hi = wilson(1, 150)
    assert r["ci"][0] <= lo + 1e-4 and r["ci"][1] >= hi - 1e-4 and r["ci"][1] > 0.035
    assert effective_size(np.array([1.0] + [0.0] * 149), np.ones(150)) == pytest.approx(150)
    # 30 trajectories of 5 steps that diverge together: the design effect is 5
    sums = np.array([5.0] * 6 + [0.0] * 24)
    counts = np.full(30, 5.0)
    assert effective_size(sums, counts) == pytest.approx(30.0)
    # a score mean (not a rate) keeps its bootstrap interval
    m = cluster_ratio([0.5, 0.25, 0.75, 0.5] * 10, list(range(40)))
    assert m["method"] == "trajectory_bootstrap" and m["ci"][1] - m["ci"][0] < 0.2


def test_a_mean_outside_zero_one_without_spread_gets_no_rates_interval():
    """Found by hypothesis through experiments.sweep_seeds: every value −1 (a difference) used to
    get Wilson's interval of a rate, [0, …], which does not hold its own point."""
    res = cluster_ratio([-1.0, -1.0, -1.0], ["a", "b", "c"], SPEC)
    assert res["point"] == -1.0 and res["ci"] is None and res["method"] == "no_spread"
    res = cluster_ratio([2.5, 2.5], ["a", "b"], SPEC)
    assert res["ci"] is None
    res = cluster_ratio([0.0, 0.0], ["a", "b"], SPEC)  # a rate of 0: Wilson still applies
    assert res["method"] == "wilson_trajectories" and res["ci"][0] == 0.0 < res["ci"][1]


def test_a_side_with_one_cluster_gives_a_p_value_that_agrees_with_its_interval():
    """Issue #39 (B11): A is one trajectory (one cluster), B many that all diverge. The bootstrap
    held A fixed: no spread, so the interval was Newcombe's (0 inside) while the p-value was
    the bootstrap's floor (0.001, "significant"). Both now come from Newcombe's interval."""
    a = cluster_sums(*[np.array(x) for x in ([0, 0, 0], [0.0, 0.0, 1.0])], 1)
    b = cluster_sums(np.arange(3), np.ones(3))
    for level in (0.95, 0.5):
        d = ratio_difference(a, b, IntervalSpec(resamples=500, seed=0, level=level), False)[0]
        assert d["method"] == NEWCOMBE_TRAJECTORIES and d["test"] == "newcombe_inverted"
        assert (d["p_value"] < 1 - level) == (not d["ci"][0] <= 0 <= d["ci"][1])
    # one cluster against many with spread: the bootstrap would ignore A's uncertainty
    b2 = cluster_sums(np.arange(6), np.array([1.0, 1.0, 1.0, 1.0, 0.0, 1.0]))
    d = ratio_difference(a, b2, IntervalSpec(resamples=500, seed=0), False)[0]
    assert d["method"] == NEWCOMBE_TRAJECTORIES and d["ci"][0] <= 0 <= d["ci"][1]
    assert d["p_value"] >= 0.05


@settings(max_examples=60, deadline=None)
@given(flag_trajectories, flag_trajectories, st.sampled_from([0.5, 0.9, 0.95]))
def test_p_value_and_interval_agree_wherever_the_interval_is_newcombes(ta, tb, level):
    """Independent audits (the paired design keeps its exact sign-flip test)."""
    (va, ga), (vb, gb) = _flat(ta), _flat(tb)
    sa = cluster_sums(cluster_codes(ga)[0], np.array(va))
    sb = cluster_sums(cluster_codes(gb)[0], np.array(vb))
    d = ratio_difference(sa, sb, IntervalSpec(resamples=100, seed=0, level=level), False)[0]
    if d["method"] == NEWCOMBE_TRAJECTORIES and d["ci"] is not None:
        inside = d["ci"][0] - 1e-9 <= 0 <= d["ci"][1] + 1e-9
        edge = min(abs(d["ci"][0]), abs(d["ci"][1])) < 1e-6
        assert edge or (d["p_value"] < 1 - level) == (not inside)
