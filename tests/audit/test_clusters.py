"""Intervals that resample the right unit (issue 38): the declared units, the cluster bootstrap's
coverage with BFCL-like correlated variants, the exact paired test, the Monte-Carlo error, skill
against an identical reference, and the cluster-robust depth trend (known answers)."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.stats.clusters import assign_clusters, resolve_unit
from audit.stats.intervals import (
    SIGN_FLIP,
    IntervalSpec,
    cluster_codes,
    cluster_sums,
    mc_error,
    ratio_difference,
    ratio_intervals,
    sign_flip_p,
)
from audit.stats.trend import cluster_robust_cov, depth_trend, logistic_irls
from audit.worlds.reference import skill_with_ci
from envace.core.envs.units import cluster_id, infer_unit, resampling_unit, scenario_of

# ------------------------------------------------------------------ the declared units


def test_each_family_declares_its_unit():
    assert resampling_unit("bfcl") == "scenario"
    assert resampling_unit("agentdojo") == resampling_unit("tau2") == "task"
    assert resampling_unit("my_plugin") == "task"  # unknown: the task

    class Declares:
        resampling_unit = "trajectory"

    assert resampling_unit("my_plugin", Declares) == "trajectory"
    assert resampling_unit("bfcl", object()) == "scenario"  # no declaration: the table


def test_bfcl_variants_share_their_scenario_and_others_are_their_own():
    variants = [f"multi_turn_{c}_17" for c in ("base", "miss_func", "miss_param", "long_context")]
    assert {scenario_of(t) for t in variants} == {"bfcl:17"}
    assert scenario_of("multi_turn_base_170") != scenario_of("multi_turn_base_17")
    assert scenario_of("workspace/user_task_3") == "workspace/user_task_3"
    assert infer_unit(variants) == "scenario"
    assert infer_unit(["workspace/user_task_3", "slack/user_task_0"]) == "task"
    assert infer_unit(["multi_turn_base_0", "workspace/user_task_0"]) == "task"  # mixed
    assert infer_unit(["t1"]) == "task"
    assert cluster_id("t", "trajectory", trajectory_id="r1") == "r1"
    assert cluster_id("t", "suite", record={"suite": "bank"}) == "suite:bank"
    assert cluster_id("t", "suite", record={}) == "task:t"  # no field: its own task
    assert cluster_id("t", "mine", cluster_of=lambda t: t.upper()) == "T"
    with pytest.raises(ValueError):
        cluster_id("t", "trajectory")


def test_rows_are_clustered_by_the_declared_unit_or_the_override():
    rows = [{"trajectory_id": f"r{i}", "task_id": f"multi_turn_{c}_{i % 2}"}
            for i, c in enumerate(["base", "miss_func", "miss_param", "long_context"])]
    assert resolve_unit(rows, None) == "scenario"
    assign_clusters(rows, "scenario")
    assert [r["cluster"] for r in rows] == ["bfcl:0", "bfcl:1", "bfcl:0", "bfcl:1"]
    assign_clusters(rows, resolve_unit(rows, "trajectory"))
    assert [r["cluster"] for r in rows] == ["r0", "r1", "r2", "r3"]


# ------------------------------------------------------------------ coverage


def _bfcl_like(rng: np.random.Generator, scenarios: int = 30, calls: int = 5,
               shared: float = 0.87) -> tuple[np.ndarray, list[str], list[str]]:
    """30 scenarios x 4 variants: each variant repeats the scenario's verdict on a call with
    probability ``shared``, else draws its own; scenario difficulty ~ Beta(3, 3) (mean 0.5)."""
    values, traj, scen = [], [], []
    for s in range(scenarios):
        p = rng.beta(3, 3)
        base = rng.random(calls) < p
        for v in range(4):
            own = rng.random(calls) < p
            keep = rng.random(calls) < shared
            values.extend(np.where(keep, base, own).astype(float))
            traj += [f"s{s}v{v}"] * calls
            scen += [f"s{s}"] * calls
    return np.array(values), traj, scen


def _covers(values: np.ndarray, groups: list[str], spec: IntervalSpec, truth: float) -> bool:
    codes, _ = cluster_codes(groups)
    sums, counts = cluster_sums(codes, values)
    ci = ratio_intervals(sums, counts, spec, binary=[True])[0]["ci"]
    return ci[0] <= truth <= ci[1]


def test_clustered_intervals_cover_with_correlated_variants():
    """The audit's 95 % interval over a BFCL-like split: resampling trajectories undercovers
    (the four variants are not four observations); resampling scenarios covers."""
    rng = np.random.default_rng(38)
    sims = 300
    by_scenario = by_trajectory = 0
    for i in range(sims):
        values, traj, scen = _bfcl_like(rng)
        spec = IntervalSpec(resamples=400, seed=i)
        by_scenario += _covers(values, scen, spec, 0.5)
        by_trajectory += _covers(values, traj, spec, 0.5)
    # 300 simulations: the standard error of a coverage near 0.95 is about 0.013
    assert by_scenario / sims >= 0.90
    assert by_trajectory / sims <= 0.85
    assert by_scenario - by_trajectory >= 0.1 * sims


# ------------------------------------------------------------------ the exact paired test


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 30), st.integers(0, 30), st.integers(0, 20))
def test_sign_flip_with_one_call_per_cluster_is_the_exact_mcnemar(only_b, only_a, same):
    from scipy.stats import binomtest

    d = [1] * only_b + [-1] * only_a + [0] * same
    p = sign_flip_p(d)
    expected = binomtest(only_b, only_a + only_b, 0.5).pvalue if only_a + only_b else 1.0
    assert p == pytest.approx(expected, rel=1e-9, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-4, 4), min_size=1, max_size=10))
def test_sign_flip_equals_brute_force_enumeration(d):
    t = abs(sum(d))
    hits = sum(abs(sum(e * x for e, x in zip(signs, d, strict=True))) >= t
               for signs in itertools.product((1, -1), repeat=len(d)))
    assert sign_flip_p(d) == pytest.approx(hits / 2 ** len(d), abs=1e-12)
    assert sign_flip_p([x + 0.5 for x in d]) is None  # not counts: no exact test


def test_paired_rates_get_the_exact_test_without_a_floor():
    """60 clusters, B diverges where A does not on 40 of them: the exact p is 2 * 0.5**40, far
    below the bootstrap's floor 2 / (B + 1)."""
    a = np.zeros((60, 1))
    b = np.zeros((60, 1))
    b[:40] = 1.0
    n = np.ones((60, 1))
    row = ratio_difference((a, n), (b, n), IntervalSpec(resamples=500, seed=0), paired=True)[0]
    assert row["test"] == SIGN_FLIP
    assert row["p_value"] == pytest.approx(2 * 0.5 ** 40)
    indep = ratio_difference((a, n), (b, n), IntervalSpec(resamples=500, seed=0),
                             paired=False)[0]
    assert indep["test"] == "bootstrap" and indep["p_value"] >= 2 / 501


# ------------------------------------------------------------------ Monte-Carlo error


def test_mc_error_matches_the_asymptotic_standard_error_of_a_quantile():
    """For normal replicates the SE of the q-quantile of B draws is sqrt(q(1-q)/B) / phi(z_q)."""
    from scipy.stats import norm

    rng = np.random.default_rng(0)
    for b in (1000, 4000):
        errs = [mc_error(rng.standard_normal(b), 0.95) for _ in range(20)]
        expected = math.sqrt(0.025 * 0.975 / b) / norm.pdf(norm.ppf(0.025))
        assert np.mean(errs) == pytest.approx(expected, rel=0.25)
    assert mc_error(np.array([1.0]), 0.95) is None


def test_bootstrap_intervals_state_their_mc_error():
    codes, _ = cluster_codes([f"t{i // 3}" for i in range(60)])
    values = np.random.default_rng(2).random(60)  # scores: replicates off any lattice
    sums, counts = cluster_sums(codes, values)
    small = ratio_intervals(sums, counts, IntervalSpec(resamples=200, seed=1))[0]
    big = ratio_intervals(sums, counts, IntervalSpec(resamples=3200, seed=1))[0]
    assert small["mc_error"] > big["mc_error"] > 0
    assert IntervalSpec(seed=7).describe()["seed"] == 7


# ------------------------------------------------------------------ skill


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.0, 0.5]), min_size=1, max_size=40))
def test_skill_against_an_identical_reference_is_exactly_zero(values):
    out = skill_with_ci(values, values, groups=[str(i % 5) for i in range(len(values))])
    if np.mean(values) < 1.0:
        assert (out["point"], out["lo"], out["hi"]) == (0.0, 0.0, 0.0)
        assert out["method"] == "identical_to_reference"
    else:
        assert out["point"] is None  # F_ref = 1: no room to improve, no skill


# ------------------------------------------------------------------ depth trend


def test_irls_matches_scikit_learns_unpenalised_fit():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(3)
    x = rng.normal(size=(300, 2))
    y = (rng.random(300) < 1 / (1 + np.exp(-(0.3 + x @ [0.8, -0.5])))).astype(float)
    beta, ok = logistic_irls(np.column_stack([np.ones(300), x]), y)
    ref = LogisticRegression(C=np.inf, tol=1e-10, max_iter=10_000).fit(x, y)
    assert ok
    assert beta == pytest.approx([ref.intercept_[0], *ref.coef_[0]], abs=1e-5)


def test_sandwich_of_a_saturated_two_by_two_is_woolfs_variance():
    """Known answer: with a binary covariate the fit is saturated, the sandwich of singleton
    clusters equals the model variance of the log odds ratio, 1/a + 1/b + 1/c + 1/d, times
    the factor G / (G - 1)."""
    a, b, c, d = 12, 18, 25, 15  # x=1: 12 events, 18 non; x=0: 25 events, 15 non
    x1 = np.array([1] * (a + b) + [0] * (c + d), dtype=float)
    y = np.array([1] * a + [0] * b + [1] * c + [0] * d, dtype=float)
    x = np.column_stack([np.ones_like(x1), x1])
    beta, _ = logistic_irls(x, y)
    assert beta[1] == pytest.approx(math.log((a * d) / (b * c)), abs=1e-9)
    g = len(y)
    cov = cluster_robust_cov(x, y, beta, np.arange(g))
    assert cov[1, 1] == pytest.approx((1 / a + 1 / b + 1 / c + 1 / d) * g / (g - 1), rel=1e-9)


def test_depth_trend_is_cluster_robust_to_duplicated_trajectories():
    """Four copies of every trajectory in its own cluster (BFCL's variants at their most
    alike): the odds ratio is the same, and so is its cluster-robust interval; resampling the
    copies as independent would shrink the interval by half."""
    rng = np.random.default_rng(5)
    depths, ys, traj = [], [], []
    for t in range(40):
        for k in range(6):
            depths.append(k)
            ys.append(float(rng.random() < 0.6 - 0.05 * k))
            traj.append(f"t{t}")
    one = depth_trend(depths, ys, traj)
    copies = depth_trend(depths * 4, ys * 4, traj * 4)
    naive = depth_trend(depths * 4, ys * 4, [f"{t}#{i}" for i in range(4) for t in traj])
    assert copies["odds_ratio_per_depth"] == pytest.approx(one["odds_ratio_per_depth"])
    assert copies["se"] == pytest.approx(one["se"], rel=1e-6)
    assert naive["se"] < 0.6 * copies["se"]
    lo, hi = one["ci"]
    assert lo < one["odds_ratio_per_depth"] < hi


def test_depth_trend_says_why_it_cannot_fit():
    assert depth_trend([0, 1, 2], [0, 0, 0], ["a", "b", "c"])["note"].startswith("cannot fit")
    assert depth_trend([1, 1, 1], [0, 1, 0], ["a", "b", "c"])["note"].endswith("one depth")
    assert depth_trend([0, 1, 2, 3], [0, 0, 1, 1], ["a"] * 4)["odds_ratio_per_depth"] is None


# ------------------------------------------------------------------ the summary


def _opts(**kw):
    return SimpleNamespace(scorers=["exact"], verdict_scorer="exact", verdict_threshold=1.0,
                           reference=None, override=None, **kw)


def _rows(task_of) -> list[dict]:
    rng = np.random.default_rng(1)
    rows = []
    for s in range(8):
        p = rng.beta(2, 2)
        for c in ("base", "miss_func", "miss_param", "long_context"):
            for k in range(3):
                d = bool(rng.random() < p)
                rows.append({"trajectory_id": f"{c}-{s}", "task_id": task_of(c, s), "step": k,
                             "depth": k, "tool": "ls", "diverged": d,
                             "scores": {"exact": float(not d)}, "mutates_state": False,
                             "novelty": 0.5, "unanswered": False, "source_rehearsed": True,
                             "actual_error": False, "rehearsed_error": False,
                             "malformed": False})
    return rows


def test_summary_records_and_resamples_the_declared_unit():
    from audit.stats.summary import build_summary

    def summary(rows, **kw):
        return build_summary(rows, _opts(**kw), trajectories=32, read=32, skipped=[],
                             warnings=[], inputs=["x"], seconds=0.0, logistic_boot=0)

    bfcl = summary(_rows(lambda c, s: f"multi_turn_{c}_{s}"))
    assert bfcl["resampling_unit"] == bfcl["interval"]["resampling_unit"] == "scenario"
    assert bfcl["interval"]["clusters"] == bfcl["counts"]["scored_clusters"] == 8
    assert bfcl["counts"]["scored_trajectories"] == 32
    assert bfcl["interval"]["seed"] == 0 and bfcl["divergence_ci_mc_error"] > 0
    by_traj = summary(_rows(lambda c, s: f"multi_turn_{c}_{s}"), cluster_by="trajectory")
    assert by_traj["resampling_unit"] == "trajectory" and by_traj["interval"]["clusters"] == 32
    assert bfcl["divergence_rate"] == by_traj["divergence_rate"]
    width = [x["divergence_ci"][1] - x["divergence_ci"][0] for x in (bfcl, by_traj)]
    assert width[0] > width[1]  # four near-copies are not four observations
    other = summary(_rows(lambda c, s: f"task-{c}-{s}"))
    assert other["resampling_unit"] == "task" and other["interval"]["clusters"] == 32
    trend = bfcl["compounding"]["depth_trend"]
    assert trend["clusters"] == 8 and set(bfcl["compounding"]["questions"]) == {
        "ratio", "depth_trend", "history.own_minus_real"}


def test_cluster_by_rejects_a_bad_unit(capsys):
    from audit.cli import main

    with pytest.raises(SystemExit) as exc:  # argparse: a usage error
        main(["compare", "a", "b", "--cluster-by", "no such/field"])
    assert exc.value.code == 2
    assert "--cluster-by" in capsys.readouterr().err
