"""Coverage of audit.stats.history's paired difference (own − real) on simulated probes with a known
answer: trajectories whose steps share a trajectory-level difficulty (correlated within a
trajectory), a real-history verdict drawn from it, and an own-history verdict that adds a known
induced probability after the model's first own error (and may recover a real error).

The true own − real is the mean of many simulated trajectories; over seeded repetitions the
point estimate must be close to it and the 95 % interval must cover it in at least 88 % of
repetitions (the percentile bootstrap alone covered 0.82 in the first case: rare induced errors
held by a few trajectories make it too narrow on the upper side).
"""

from __future__ import annotations

import numpy as np
import pytest

from audit.stats.history import Pair, decompose, discordant_interval
from audit.stats.intervals import IntervalSpec


def _simulate(rng: np.random.Generator, n_traj: int, length: int, p_base: float,
              p_induced: float, p_recover: float, icc: float = 0.3) -> list[Pair]:
    a, b = p_base * (1 - icc) / icc, (1 - p_base) * (1 - icc) / icc
    pairs = []
    for t in range(n_traj):
        q = rng.beta(a, b)  # this trajectory's difficulty: its steps are correlated
        misled = False
        for s in range(length):
            real = bool(rng.random() < q)
            own = (real and not rng.random() < p_recover) or \
                (not real and misled and bool(rng.random() < p_induced))
            misled = misled or own
            pairs.append(Pair(f"t{t}", s, s, real, own))
    return pairs


def _true_diff(**model) -> float:
    pairs = _simulate(np.random.default_rng(12345), 20000, **model)
    return float(np.mean([p.own for p in pairs]) - np.mean([p.real for p in pairs]))


@pytest.mark.parametrize("n_traj, model", [
    (25, {"length": 6, "p_base": 0.08, "p_induced": 0.3, "p_recover": 0.0}),
    (30, {"length": 5, "p_base": 0.2, "p_induced": 0.2, "p_recover": 0.2}),
])
def test_diff_interval_covers_the_truth(n_traj, model):
    truth = _true_diff(**model)
    rng = np.random.default_rng(7)
    reps, covered, estimates = 80, 0, []
    for i in range(reps):
        block = decompose(_simulate(rng, n_traj, **model), IntervalSpec(resamples=200, seed=i))
        d = block["overall"]["diff"]
        estimates.append(d["diff"])
        covered += d["ci"][0] <= truth <= d["ci"][1]
    assert abs(np.mean(estimates) - truth) < 0.01  # unbiased (a mean of a ratio of sums)
    assert covered / reps >= 0.88, (covered, reps, truth)


def test_history_blind_noise_covers_zero():
    """Verdicts drawn independently per history with the same rate: no compounding; the
    paired interval covers 0 and is not the unpaired fallback's."""
    rng = np.random.default_rng(3)
    covered = 0
    for i in range(40):
        pairs = [Pair(f"t{t}", s, s, bool(rng.random() < 0.2), bool(rng.random() < 0.2))
                 for t in range(20) for s in range(4)]
        lo, hi = decompose(pairs, IntervalSpec(resamples=200, seed=i))["overall"]["diff"]["ci"]
        covered += lo <= 0.0 <= hi
    assert covered >= 36


def test_identical_verdicts_interval_is_paired():
    """Own == real on every call: the difference is 0 in every resample. The interval is the
    discordant one (0 discordant calls in 40 trajectories: Wilson's upper bound with n = 40,
    about 0.088 either way), not an unpaired one of two 20 % rates (about ±0.17)."""
    pairs = [Pair(f"t{t}", s, s, s == t % 5, s == t % 5) for t in range(40) for s in range(5)]
    d = decompose(pairs, IntervalSpec(resamples=200, seed=0))["overall"]["diff"]
    assert d["diff"] == 0.0 and d["method"] == "newcombe_discordant_effective"
    assert d["ci"][0] == pytest.approx(-d["ci"][1])
    assert 0.08 < d["ci"][1] < 0.095


def test_discordant_interval_edges():
    z = 1.96
    assert discordant_interval(np.zeros(0), np.zeros(0), np.zeros(0), z) is None
    one = discordant_interval(np.array([2.0]), np.array([0.0]), np.array([5.0]), z)
    assert one is not None and one[0] <= 0.4 <= one[1] and one[1] - one[0] > 0.5
    lo, hi = discordant_interval(np.array([3.0, 0.0, 1.0]), np.array([0.0, 1.0, 0.0]),
                                 np.array([5.0, 5.0, 5.0]), z)
    assert lo < 3 / 15 < hi and lo >= -1.0 and hi <= 1.0


def test_one_trajectory_claims_no_bootstrap_p_value():
    """One trajectory: every resample is that trajectory, the replicates have no spread; the
    interval is the discordant score interval (wide) and there is no p-value to claim."""
    pairs = [Pair("a", s, s, s == 1, s >= 1) for s in range(5)]
    d = decompose(pairs, IntervalSpec(resamples=100, seed=0))["overall"]["diff"]
    assert d["diff"] == pytest.approx(0.6) and d["method"] == "newcombe_discordant_effective"
    # the exact sign-flip test needs no replicates: one cluster can be flipped either way and
    # both signs are as extreme, p = 1 (never the bootstrap's 2 / (B + 1))
    assert d["p_value"] == 1.0 and d["test"] == "exact_cluster_sign_flip"
    assert d["ci"][0] < 0.0 < 0.6 < d["ci"][1]
