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


def test_interval_over_seeds_is_scipys_t_interval():
    from scipy import stats

    from experiments.fidelity_nll_curve import seed_interval

    xs = [0.252, 0.080, 0.147]
    lo, hi = seed_interval(xs)
    ref = stats.t.interval(0.95, len(xs) - 1, loc=sum(xs) / 3, scale=stats.sem(xs))
    assert (lo, hi) == pytest.approx(ref)
    assert seed_interval([0.1]) is None


def test_combine_joins_runs_of_one_recipe_and_refuses_others(tmp_path, monkeypatch):
    import json

    import experiments.fidelity_nll_curve as m

    written = {}
    monkeypatch.setattr(m, "write_result", lambda name, data: written.update({name: data}))
    recipe = {"steps": 30, "recipe": ["lr=3e-4"]}
    files = []
    for i, (mode, seed, change) in enumerate([("grpo", 0, 0.2), ("envace", 0, 0.1),
                                              ("grpo", 1, 0.0), ("envace", 1, 0.1)]):
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps({"settings": recipe, "runs": [
            {"mode": mode, "seed": seed, "extra": [], "change": change}]}))
        files.append(str(p))
    assert m.main(["--combine", *files, "--name", "c"]) == 0
    s = written["c"]["summary"]
    assert s["grpo"]["seeds"] == [0, 1] and s["grpo"]["mean_change"] == pytest.approx(0.1)
    assert s["envace_minus_grpo"]["per_seed"] == pytest.approx([-0.1, 0.1])
    assert [r["from"] for r in written["c"]["runs"]] == [files[1], files[0], files[3], files[2]]
    with pytest.raises(SystemExit, match="more than one file"):
        m.main(["--combine", files[0], files[0], "--name", "d"])
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"settings": {**recipe, "steps": 4}, "runs": []}))
    with pytest.raises(SystemExit, match="settings differ"):
        m.main(["--combine", files[0], str(other), "--name", "e"])


def test_trust_gate_training_pairs_steps_within_a_seed_and_seeds_over(tmp_path, monkeypatch):
    import json

    import experiments.trust_gate_training as t

    written = {}
    monkeypatch.setattr(t, "write_result", lambda name, data: written.update({name: data}))

    def run(name, rewards, extra=None):
        d = tmp_path / name
        d.mkdir()
        rows = [{"step": i, "reward/mean": r, **(extra or {})} for i, r in enumerate(rewards)]
        rows[-1]["fidelity_bpb_end"] = 0.9
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(d)

    gated = [run("g0", [0.2, 0.4], {"calls/gated_real": 3, "calls/rehearsed": 1}),
             run("g1", [0.1, 0.1], {"calls/gated_real": 2, "calls/rehearsed": 2})]
    plain = [run("e0", [0.1, 0.1], {"fidelity/steps": 5}), run("e1", [0.1, 0.3])]
    grpo = [run("r0", [0.0, 0.0]), run("r1", [0.2, 0.2])]
    assert t.main(["--steps", "2", "--gated", *gated, "--envace", *plain, "--grpo", *grpo,
                   "--seeds", "0", "1"]) == 0
    res = written["trust_gate_training_tiny"]
    s0 = res["seeds"]["0"]
    assert s0["gated"]["minus_envace"]["mean"] == pytest.approx(0.2)  # (0.1 + 0.3) / 2
    assert s0["gated"]["calls_gated_real"] == 6 and s0["envace"]["calls_rehearsed"] == 10
    assert s0["gated"]["bits_per_byte_after"] == 0.9
    over = res["over_seeds"]["gated_minus_envace"]
    assert over["per_seed"] == pytest.approx([0.2, -0.1]) and over["mean"] == pytest.approx(0.05)
    with pytest.raises(SystemExit, match="fewer than --steps"):
        t.main(["--steps", "3", "--gated", gated[0], "--envace", plain[0], "--grpo", grpo[0]])
