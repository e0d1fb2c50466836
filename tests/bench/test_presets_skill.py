"""experiments.presets' skill recomputation: the stored per-step scores and the rebuilt
references give the stored point, and the interval resamples BFCL scenarios (issue 38)."""

from __future__ import annotations

import pytest

from audit.worlds.reference import skill_with_ci
from experiments.presets import cluster_of_id, recompute_skill

IDS = [["real-multi_turn_base_1", 0], ["real-multi_turn_miss_func_1", 0],
       ["real-multi_turn_base_2", 0], ["real-multi_turn_long_context_2", 1],
       ["real-multi_turn_base_3", 0], ["real-multi_turn_miss_param_3", 2]]
MODEL = [1, 1, 0, 0, 1, 0]
F1 = [0.9, 0.8, 0.1, 0.2, 0.7, 0.3]
REF = {"lookup": {"exact": [1.0, 1.0, 1.0, 0.0, 1.0, 1.0],
                  "json_f1": [1.0, 0.9, 0.5, 0.2, 0.8, 0.6]}}


def _row(stored_point: float | None) -> dict:
    return {"per_step": {"ids": IDS, "rehearse_exact": MODEL, "rehearse_json_f1": F1},
            "skill": {"lookup": {"exact": {"point": stored_point, "lo": -9.0, "hi": 9.0}}}}


def test_the_interval_resamples_scenarios_and_keeps_the_old_one_beside_it():
    point = skill_with_ci(MODEL, REF["lookup"]["exact"])["point"]
    out = recompute_skill(_row(point), REF)["lookup"]["exact"]
    groups = [cluster_of_id(t) for t, _ in IDS]
    assert len(set(groups)) == 3  # a scenario's category variants are one cluster
    want = skill_with_ci(MODEL, REF["lookup"]["exact"], groups=groups, n_boot=2000, seed=0)
    assert (out["point"], out["lo"], out["hi"]) == (want["point"], want["lo"], want["hi"])
    by_traj = skill_with_ci(MODEL, REF["lookup"]["exact"], groups=[t for t, _ in IDS],
                            n_boot=2000, seed=0)
    assert (out["lo"], out["hi"]) != (by_traj["lo"], by_traj["hi"])
    assert out["resampling_unit"] == "scenario" and out["trajectory_interval"] == [-9.0, 9.0]


def test_a_rebuilt_reference_that_disagrees_with_the_stored_point_is_refused():
    with pytest.raises(ValueError, match="not the stored"):
        recompute_skill(_row(0.5), REF)
