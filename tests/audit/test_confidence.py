"""Confidence as a predictor of divergence (audit.stats.confidence): the AUROC and the
risk-coverage curve against scikit-learn on the same columns, known answers, and the step rows'
`confidence` from recorded rollouts (replay) and from answers that carry their log-probability
(the probe)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score, roc_curve

from audit.probe import probe_trajectory
from audit.replay import replay_trajectory
from audit.scoring.settings import AuditOptions
from audit.stats.confidence import (
    Rehearsal,
    auroc,
    auroc_interval,
    confidence_block,
    coverage_at_risk,
    mean_token_logprob,
    risk_coverage,
)
from audit.stats.intervals import IntervalSpec
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.core.schema import Trajectory

columns = st.lists(st.tuples(st.sampled_from([-3.0, -1.5, -1.0, -0.5, -0.2, 0.0]),
                             st.booleans()), min_size=2, max_size=60)


@settings(max_examples=60, deadline=None)
@given(columns)
def test_auroc_and_risk_coverage_equal_sklearn(data):
    conf = np.array([c for c, _ in data])
    div = np.array([d for _, d in data])
    if div.all() or not div.any():
        assert auroc(conf, div) is None
        return
    assert auroc(conf, div) == pytest.approx(roc_auc_score(div, -conf))
    # sklearn's ROC of "right" (not diverged) scored by confidence: at each threshold the
    # covered steps are tp + fp, the wrong ones among them fp
    right = ~div
    fpr, tpr, thr = roc_curve(right, conf, drop_intermediate=False)
    p, n = right.sum(), div.sum()
    covered = tpr * p + fpr * n
    want = {float(t): (covered[i] / len(conf), fpr[i] * n / covered[i])
            for i, t in enumerate(thr) if math.isfinite(t)}
    got = {p_["threshold"]: (p_["coverage"], p_["risk"]) for p_ in risk_coverage(conf, div)}
    assert got.keys() == want.keys()
    for t in got:
        assert got[t] == pytest.approx(want[t])


def test_known_answers():
    conf = [-0.1, -0.2, -0.3, -2.0, -3.0]
    div = [False, False, False, True, True]
    assert auroc(conf, div) == 1.0  # every diverged step below every right one
    curve = risk_coverage(conf, div)
    assert curve[0] == {"threshold": -0.1, "coverage": 0.2, "risk": 0.0, "covered": 1}
    at = coverage_at_risk(curve)
    assert at["5%"]["coverage"] == pytest.approx(0.6) and at["5%"]["threshold"] == -0.3
    assert auroc([-1.0, -1.0], [True, False]) == 0.5  # a tie is no information
    assert mean_token_logprob(-6.0, 3) == -2.0
    assert mean_token_logprob(-6.0, 0) is None and mean_token_logprob(float("nan"), 3) is None


def test_interval_resamples_clusters_and_block_is_complete():
    rng = np.random.default_rng(0)
    conf = -np.abs(rng.normal(size=200))  # log-probabilities
    div = rng.random(200) < 1 / (1 + np.exp(3 * (conf + 0.7)))
    est = auroc_interval(conf, div, [i // 4 for i in range(200)], IntervalSpec(300, 0))
    assert est["ci"][0] <= est["point"] <= est["ci"][1] and est["clusters"] == 50
    rows = [{"trajectory_id": f"t{i // 4}", "cluster": f"c{i // 4}", "confidence": float(c),
             "diverged": bool(d)} for i, (c, d) in enumerate(zip(conf, div, strict=True))]
    b = confidence_block(rows, IntervalSpec(100, 0))
    assert b["steps"] == 200 and b["auroc"]["point"] == pytest.approx(est["point"])
    assert sum(x["n"] for x in b["reliability"]) == 200
    assert set(b["coverage_at_risk"]) == {"1%", "5%", "10%"}


@pytest.fixture(scope="module")
def traj():
    return next(t for t in export_real(split_tasks("dev")[:10]) if len(t.tool_steps()) >= 3)


def test_replay_reads_confidence_from_recorded_rollouts(traj):
    data = traj.dump()
    for k, m in enumerate(data["messages"]):
        if m["role"] == "tool":
            m.update(rehearsed=True, logprob=-2.0 * (k + 1), num_tokens=4)
    rollout = Trajectory.model_validate(data)
    rows = replay_trajectory(rollout, AuditOptions()).steps
    by_index = {id(st.response): st for st in rollout.tool_steps()}
    assert rows and all(r["confidence"] == pytest.approx(
        by_index[id(rollout.tool_steps()[r["step"]].response)].response.logprob / 4) for r in rows)


def test_probe_rows_take_confidence_from_answers_that_carry_it(traj):
    answer = Rehearsal.of("{}", -3.0, 6, -1.5)
    rows = probe_trajectory(traj, lambda *a: answer, AuditOptions()).steps
    assert all(r["confidence"] == -0.5 and r["confidence_min"] == -1.5 for r in rows)
    plain = probe_trajectory(traj, lambda *a: "{}", AuditOptions()).steps
    assert all("confidence" not in r for r in plain)
