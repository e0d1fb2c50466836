"""experiments.fidelity_nll_curve's arithmetic: a run's curve from its metrics rows, and the
per-mode summary (known answers)."""

from __future__ import annotations

import pytest

from experiments.fidelity_nll_curve import curve_of, summarise


def test_curve_points_are_after_the_updates_done_and_end_after_the_last():
    rows = [{"step": 0, "fidelity_bpb": 1.0, "fidelity_bpb_tokens": 10, "fidelity/exact": 0.5},
            {"step": 1, "fidelity/exact": float("nan")},
            {"step": 2, "fidelity_bpb": 1.2, "fidelity_bpb_tokens": 10,
             "fidelity_bpb_end": 1.5, "fidelity_bpb_end_tokens": 10}]
    c = curve_of(rows)
    assert c["points"] == [[0, 1.0, 10], [2, 1.2, 10], [3, 1.5, 10]]
    assert (c["start"], c["end"]) == (1.0, 1.5) and c["change"] == pytest.approx(0.5)
    assert c["generation_exact"] == [[0, 0.5]]
    assert curve_of([{"step": 0}])["change"] is None


def test_summary_per_mode_and_envace_minus_grpo_per_seed():
    runs = [{"mode": "grpo", "seed": 0, "change": 0.1}, {"mode": "envace", "seed": 0,
                                                          "change": 0.4},
            {"mode": "grpo", "seed": 1, "change": -0.1}]
    s = summarise(runs)
    assert s["grpo"]["mean_change"] == pytest.approx(0.0) and s["grpo"]["up_in"] == 1
    assert s["envace"]["changes"] == [0.4]
    assert s["envace_minus_grpo"]["per_seed"] == pytest.approx([0.3])
