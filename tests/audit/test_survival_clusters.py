"""First-divergence survival (Kaplan–Meier) intervals resample the audit's unit (issue 38).

Known answers: a cluster of identical copies of a trajectory carries the information of one
trajectory, so copying every trajectory four times within its cluster leaves the curve and its
cluster-bootstrap interval exactly as they were (Greenwood's, which counts the copies as
independent, narrows by about 2); with one trajectory per cluster the bootstrap interval agrees
with Greenwood's within a small tolerance; a coverage simulation with correlated variants.
"""

from __future__ import annotations

import numpy as np
import pytest

from audit.stats.intervals import IntervalSpec
from audit.stats.summary import summarize
from audit.stats.survival import first_divergence_survival


def _steps(times: list[tuple[int, bool]], copies: int = 1) -> list[dict]:
    """Trajectory i of cluster c{i}: matched steps up to its time, then a diverged one (event)
    or its last matched step (censored); ``copies`` trajectories per cluster."""
    out = []
    for i, (u, event) in enumerate(times):
        for k in range(copies):
            for d in range(u + 1):
                out.append({"trajectory_id": f"t{i}-{k}", "cluster": f"c{i:04d}", "depth": d,
                            "tool": "f", "diverged": bool(event and d == u), "scores": {}})
    return out


def _times(rng: np.random.Generator, n: int, p: float = 0.25, horizon: int = 6
           ) -> list[tuple[int, bool]]:
    first = rng.geometric(p, size=n) - 1  # depth of the first divergence
    ends = rng.integers(1, horizon + 1, size=n) - 1  # last depth observed
    return [(int(min(f, e)), bool(f <= e)) for f, e in zip(first, ends, strict=True)]


def test_copies_within_a_cluster_leave_the_interval_unchanged():
    times = _times(np.random.default_rng(1), 40)
    spec = IntervalSpec(resamples=500, seed=3, unit="scenario")
    one = first_divergence_survival(_steps(times), spec=spec)
    four = first_divergence_survival(_steps(times, copies=4), spec=spec)
    assert four["n_trajectories"] == 4 * one["n_trajectories"] == 160
    assert four["clusters"] == one["clusters"] == 40
    assert four["resampling_unit"] == "scenario"
    assert [r["survival"] for r in four["rows"]] == pytest.approx(
        [r["survival"] for r in one["rows"]], abs=1e-12)
    boot = [r for r in four["rows"] if r["ci_method"] == "trajectory_bootstrap"]
    assert len(boot) >= 3
    for a, b in zip(one["rows"], four["rows"], strict=True):
        assert b["ci"] == pytest.approx(a["ci"], abs=1e-12)
        assert b["ci_mc_error"] == a["ci_mc_error"]
    # Greenwood counts the copies as independent: about half as wide
    r = boot[-1]
    gw_width = r["greenwood_ci"][1] - r["greenwood_ci"][0]
    assert gw_width < 0.7 * (r["ci"][1] - r["ci"][0])


def test_one_trajectory_per_cluster_agrees_with_greenwood():
    times = _times(np.random.default_rng(7), 400)
    km = first_divergence_survival(_steps(times), spec=IntervalSpec(resamples=2000, seed=0))
    checked = 0
    for r in km["rows"]:
        if r["ci_method"] != "trajectory_bootstrap" or r["at_risk"] < 40:
            continue
        checked += 1
        assert r["ci"][0] <= r["survival"] <= r["ci"][1]
        tol = 0.015 + 3 * r["ci_mc_error"]
        assert r["ci"] == pytest.approx(r["greenwood_ci"], abs=tol)
    assert checked >= 4


def test_coverage_with_correlated_variants():
    """30 clusters of 4 variants sharing their first divergence with probability 0.85 (built
    like BFCL's dev split): the clustered interval of S(1) covers near 95%."""
    rng = np.random.default_rng(11)
    p, horizon = 0.3, 4
    truth = (1 - p) ** 2  # S(1): no divergence at depths 0 and 1
    covered, greenwood, reps = 0, 0, 150
    for rep in range(reps):
        steps = []
        for c in range(30):
            shared = int(rng.geometric(p) - 1)
            for k in range(4):
                u = shared if rng.random() < 0.85 else int(rng.geometric(p) - 1)
                last = min(u, horizon)
                for d in range(last + 1):
                    steps.append({"trajectory_id": f"{c}-{k}", "cluster": f"s{c}", "depth": d,
                                  "tool": "f", "diverged": d == u, "scores": {}})
        row = first_divergence_survival(
            steps, spec=IntervalSpec(resamples=300, seed=rep, unit="scenario"))["rows"][1]
        covered += row["ci"][0] <= truth <= row["ci"][1]
        greenwood += row["greenwood_ci"][0] <= truth <= row["greenwood_ci"][1]
    assert covered / reps >= 0.88
    assert greenwood / reps <= 0.85  # counting the variants as independent: about 73%


def test_summary_block_names_unit_and_method():
    steps = _steps(_times(np.random.default_rng(2), 30), copies=2)
    s = summarize(steps, n_boot=200, logistic_boot=0, unit="scenario")
    fd = s["first_divergence"]
    assert fd["resampling_unit"] == s["interval"]["resampling_unit"] == "scenario"
    assert fd["clusters"] == 30
    assert {r["ci_method"] for r in fd["rows"]} <= {"trajectory_bootstrap", "greenwood"}
    assert any(r["ci_mc_error"] for r in fd["rows"])
