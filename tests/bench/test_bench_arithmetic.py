"""Known answers for the benchmarks' arithmetic: each figure's ratio, ceiling or interval computed
from small inputs whose answer is known by hand, or from the inputs a result file recorded (the
figure it reports must come back)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


def result(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def test_bfcl_replay_medians_and_ratio():
    from bench.bfcl_replay import summarise

    # repeats: ours (reset, execute) seconds; theirs seconds. Medians: reset 1, total 4, exec 3,
    # theirs 8 -> 100 steps / 4 s = 25/s, ours exec-only 100/3, theirs 12.5/s, ratio 2
    got = summarise(10, 100, [(1.0, 3.0), (2.0, 9.0), (0.5, 2.5)], [8.0, 20.0, 7.0])
    assert got["ours_steps_per_s"] == 25.0 and got["bfcl_eval_steps_per_s"] == 12.5
    assert got["ours_exec_only_steps_per_s"] == pytest.approx(100 / 3)
    assert got["ratio_ours_over_bfcl"] == 2.0 and got["reset_ms_per_task"] == 100.0
    assert got["repeats"] == 3


def test_bfcl_replay_recorded_ratio_is_its_rates():
    r = result("bfcl_replay")
    assert r["ratio_ours_over_bfcl"] == pytest.approx(
        r["ours_steps_per_s"] / r["bfcl_eval_steps_per_s"])


def test_audit_throughput_recorded_ratios_are_its_seconds():
    r = result("audit_throughput")
    runs = r["runs"]
    assert runs["x1_w1"]["time_over_bfcl_execution"] == pytest.approx(
        runs["x1_w1"]["seconds"] / r["bfcl_execute_seconds"])
    assert runs["x10_w1"]["time_over_bfcl_execution"] == pytest.approx(
        runs["x10_w1"]["seconds"] / (10 * r["bfcl_execute_seconds"]))
    assert r["peak_rss_growth_x10_over_x1"] == pytest.approx(
        runs["x10_w1"]["peak_rss_mib"] / runs["x1_w1"]["peak_rss_mib"])


def test_rollout_ceiling_known_answer():
    from bench.rollout_engine import ceiling_block

    # 20 GB/s over 500 MB of weights: 40 steps/s at most; 10 achieved = 25 %; with 500 MB of
    # KV read too the ceiling halves (50 %); against 1 GB of fp32 bytes the ceiling is 20 (50 %)
    got = ceiling_block(20.0, 5e8, 1e9, 5e8, 10.0, 4.0, 0.6)
    assert got["decode_steps_per_s"] == 40.0
    assert got["ratio_forward"] == 0.25 and got["ratio_end_to_end"] == 0.1
    assert got["ratio_forward_with_kv"] == 0.5 and got["ratio_forward_fp32_bytes"] == 0.5
    assert got["kv_real_share"] == 0.6


def test_rollout_engine_packed_figures_come_back_from_its_repeats():
    """The decode row's x1.37 and 21.3 % of the ceiling, from the repeats the file recorded."""
    from bench.rollout_engine import ceiling_block, repeat_ratios

    r = result("rollout_engine_packed")
    base, packed = r["models"]["smollm2+plain+compact0"], r["models"]["smollm2"]
    got = repeat_ratios(packed["repeats"], base["repeats"])
    assert got["achieved_forward_steps_per_s"] == pytest.approx(1.371, abs=5e-4)
    want = r["ratios"]["smollm2"]["smollm2"]
    for k, v in want.items():
        assert got[k] == pytest.approx(v), k
    c = packed["ceiling"]
    again = ceiling_block(c["copy_bandwidth_gb_s"], packed["param_bytes_per_decode_step"],
                          packed["param_bytes_per_decode_step"], c["kv_bytes_per_decode_step"],
                          c["achieved_forward_steps_per_s"], c["achieved_end_to_end_steps_per_s"],
                          c["kv_real_share"])
    assert again == pytest.approx(c)
    assert c["ratio_forward"] == pytest.approx(0.213, abs=5e-4)


def test_repeat_ratios_pairs_repeats_in_order_and_takes_the_median():
    from bench.rollout_engine import repeat_ratios

    k, e = "achieved_forward_steps_per_s", "achieved_end_to_end_steps_per_s"
    base = [{k: 2.0, e: 1.0}, {k: 4.0, e: 1.0}, {k: 1.0, e: 1.0}]
    variant = [{k: 3.0, e: 2.0}, {k: 4.0, e: 1.0}, {k: 5.0, e: 3.0}]
    got = repeat_ratios(variant, base)
    assert got[f"{k}_each_repeat"] == [1.5, 1.0, 5.0] and got[k] == 1.5
    assert got[e] == 2.0
    with pytest.raises(ValueError):
        repeat_ratios(variant[:2], base)


def test_fsdp_ratios():
    from bench.fsdp_memory import ratios

    rep = {"train_state": 200, "rss_after_mib": 100, "peak_rss_mib": 100,
           "seconds_per_update": 2.0}
    fs = {"train_state": 100, "rss_after_mib": 80, "peak_rss_mib": 120,
          "seconds_per_update": 3.0}
    assert ratios(rep, fs) == {"train_state": 0.5, "rss_after_mib": 0.8, "peak_rss_mib": 1.2,
                               "seconds_per_update": 1.5}
    r = result("fsdp_memory")
    assert r["ratio_fsdp_over_replicate"] == pytest.approx(ratios(r["replicate"], r["fsdp"]))


def _step(seconds, update_s, fwd, comp, reward=0.0):
    return {"seconds": seconds, "update_s": update_s, "forward_tokens": fwd,
            "completion_tokens": comp, "reward": reward}


def test_trainer_vs_trl_summary_and_ratio():
    from bench.trainer_vs_trl import ours_over_trl, summary

    # the warm-up step is skipped; medians of 2, 3, 4 s -> 20 steps/min
    ours = {"steps": [_step(60, 30, 1, 1), _step(2, 1, 100, 10), _step(3, 1, 300, 30),
                      _step(4, 2, 200, 20, 1.0)], "peak_rss": 100}
    trl = {"steps": [_step(9, 9, 1, 1), _step(6, 2, 100, 10), _step(6, 2, 100, 10)],
           "peak_rss": 200}
    s = {"ours": summary(ours, skip=1), "trl": summary(trl, skip=1)}
    assert s["ours"]["measured_steps"] == 3 and s["ours"]["steps_per_min"] == 20.0
    assert s["ours"]["update_tokens_per_s"] == 100.0  # median of 100, 300, 100
    assert s["ours"]["total_steps_per_min"] == 20.0 and s["ours"]["update_share"] == 4 / 9
    assert s["ours"]["mean_reward"] == pytest.approx(1 / 3)
    assert s["trl"]["steps_per_min"] == 10.0 and s["trl"]["update_tokens_per_s"] == 50.0
    got = ours_over_trl(s, {"ours": ours, "trl": trl})
    assert got == {"steps_per_min": 2.0, "update_tokens_per_s": 2.0,
                   "update_completion_tokens_per_s": 2.0, "peak_rss": 0.5}
    recorded = result("trainer_vs_trl")
    assert recorded["ratio_ours_over_trl"] == pytest.approx(
        ours_over_trl(recorded["summary"], recorded["raw"]))


def test_rehearsal_parallel_batching_ratio():
    from bench.rehearsal_parallel import batching

    got = batching(3.0, 6.0, 100, 100)
    assert got["ratio"] == 0.5 and got["ratio_per_token"] == 0.5
    assert batching(3.0, 6.0, 50, 100)["ratio_per_token"] == 1.0  # half the tokens, same rate
    assert batching(1.0, 1.0, 0, 0)["ratio_per_token"] == 1.0
    r = result("rehearsal_parallel")
    for run in r["runs"].values():
        again = batching(run["batched_s"], run["independent_s"], run["tokens_batched"],
                         run["tokens_independent"])
        assert again == pytest.approx(run)
    assert [round(r["runs"][n]["ratio"], 2) for n in "1234"] == [1.06, 0.59, 0.48, 0.40]


def test_vllm_side_ratios():
    from bench.vllm_rollout import side_ratios

    sides = {"hf": {"greedy": {"tokens_per_s": 10.0}, "group": {"tokens_per_s": 20.0}},
             "vllm": {"greedy": {"tokens_per_s": 30.0}, "group": {"tokens_per_s": 50.0}},
             "vllm_noprefix": {"greedy": {"tokens_per_s": 15.0}, "group": {"tokens_per_s": 50.0}}}
    assert side_ratios(sides) == {"ratio_vllm_over_hf": {"greedy": 3.0, "group": 2.5},
                                  "ratio_prefix_cache": {"greedy": 2.0, "group": 1.0}}
    for name in ("vllm_rollout", "vllm_rollout_tiny_quiet"):
        for model in result(name)["models"].values():
            got = side_ratios(model["sides"])
            assert got["ratio_vllm_over_hf"] == pytest.approx(model["ratio_vllm_over_hf"])


def test_learning_intervals_known_answers():
    from experiments.learning import boot_diff, paired_ci

    # every task moved by exactly +0.25: every resample's mean is +0.25
    assert paired_ci([0.0, 0.5, 0.25, 1.0], [0.25, 0.75, 0.5, 1.25]) == pytest.approx(
        [0.25, 0.25])
    # two constant sides: the unpaired interval is the difference itself
    assert boot_diff([0.1] * 5, [0.4] * 7) == pytest.approx([0.3, 0.3])
    # a symmetric spread around +0.5 holds it, and stays inside the differences' range
    lo, hi = paired_ci([0.0] * 6, [0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    assert 0.0 <= lo < 0.5 < hi <= 1.0


def test_learning_reeval_summary_is_a_t_interval_over_seed_means():
    """experiments.learning_reeval summarises runs with experiments.claims.across_seeds: seed means
    1, 2, 3 have sd 1 and t(0.975, 2) = 4.302653, so the interval is 2 +- 4.302653 / sqrt(3)."""
    from experiments.claims import across_seeds

    got = across_seeds([[1.0, 1.0], [2.0], [3.0, 2.0, 4.0]])
    assert got["mean"] == 2.0
    assert (got["lo"], got["hi"]) == pytest.approx((2 - 4.302653 / 3 ** 0.5,
                                                    2 + 4.302653 / 3 ** 0.5), rel=1e-6)
    r = result("learning_tiny_pool30_train_conditions_grpo")["across_runs"]["grpo"]["reward"]
    again = across_seeds([[m] for m in r["per_seed"]])
    assert (again["mean"], again["lo"], again["hi"]) == pytest.approx(
        (r["mean"], r["lo"], r["hi"]))


def test_presets_shares_and_paired_difference():
    from experiments.presets import cluster_mean, paired_diff, share

    s = share([True, False, True, True], ["a", "a", "b", "b"])
    assert (s["k"], s["n"], s["rate"]) == (3, 4, 0.75)
    assert cluster_mean([1.0, 0.0, 0.5, 0.5], ["a", "a", "b", "b"])["mean"] == 0.5
    # b is a + 0.25 on every step: a - b is -0.25 in every resample, so not "significant" only
    # if the interval held zero
    d = paired_diff([0.0, 0.5, 0.5], [0.25, 0.75, 0.75], ["a", "b", "c"])
    assert d["diff"] == pytest.approx(-0.25) and d["ci"] == pytest.approx([-0.25, -0.25])
    assert d["significant"]
    level = paired_diff([0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0], ["a", "a", "b", "b"])
    assert level["diff"] == 0.0 and level["ci"] == [0.0, 0.0] and not level["significant"]


def test_dashboard_load_replicates_to_the_asked_size(tmp_path, examples):
    """bench/dashboard_load.py's big run: n steps made from a real audit's, ids distinct."""
    import subprocess
    import sys

    from bench.dashboard_load import replicate
    from envace.core.layout import AUDIT

    src = tmp_path / "src"
    subprocess.run([sys.executable, "-m", "audit.cli", "--quiet", "replay",
                    str(examples / "real.jsonl"), "--out", str(src)], check=True,
                   capture_output=True)
    rows = (src / AUDIT.steps).read_text().splitlines()
    n = replicate(src, tmp_path / "big", 5 * len(rows) + 1)
    got = [json.loads(x) for x in (tmp_path / "big" / AUDIT.steps).read_text().splitlines()]
    assert n == len(got) == 5 * len(rows) + 1
    keys = {(r["trajectory_id"], r["step"]) for r in got}
    assert len(keys) == len(got)  # every copy is a trajectory of its own


def test_reproduce_compares_bit_for_bit():
    from experiments.reproduce import compare

    rec = {"a": [0.1, 0.2], "b": 0.3, "c": {"steps": 4, "rate": 0.5}}
    assert all(c["identical"] and c["max_abs_diff"] == 0.0
               for c in compare(rec, rec).values())
    got = compare({"a": [0.1, 0.2 + 1e-16], "b": 0.3, "c": {"steps": 4, "rate": 0.25}}, rec)
    assert not got["a"]["identical"] and 0 < got["a"]["max_abs_diff"] < 1e-15
    assert got["b"]["identical"] and got["c"]["max_abs_diff"] == 0.25
    assert compare({"a": [0.1]}, rec)["a"] == {"identical": False, "max_abs_diff": None}
    r = result("reproduce_learn2_envace")
    assert r["all_identical"] == all(c["identical"] for c in r["comparison"].values())


def test_ranker_cv_known_answer():
    """Candidates whose one feature says which is right: half the calls have the right one
    first (where ``edit`` is right too), half second. Cross-validated over scenarios the ranker
    is right on all, ``edit`` on half: skill against ``edit`` 1 - (1 - 1) / (1 - 0.5) = 1."""
    from experiments.ranker_cv import cross_validate

    calls = []
    for s in range(10):
        for i in range(10):
            first = (s + i) % 2 == 0
            calls.append({"scenario": f"sc{s}", "x": [[1.0], [0.0]] if first else [[0.0], [1.0]],
                          "y": [1, 0] if first else [0, 1]})
    calls.append({"scenario": "sc0", "x": [], "y": []})  # no candidate: wrong on both sides
    got = cross_validate(calls, {"max_iter": 20, "min_samples_leaf": 5}, folds=5)
    assert got["calls"] == 101
    assert got["exact"] == pytest.approx(100 / 101)
    assert got["edit_exact"] == pytest.approx(50 / 101)
    assert got["skill_vs_edit"]["point"] == pytest.approx(1 - (1 / 101) / (51 / 101))


def test_compounding_report_rows(tmp_path, monkeypatch):
    """experiments.compounding's table reads the probe's history block: real, own, their difference
    and interval, the induced count, and the deep (depth >= 3) figures."""
    import bench.machine
    from experiments.compounding import _report

    monkeypatch.setattr(bench.machine, "RESULTS", tmp_path)
    history = {"overall": {"n": 137, "real": {"point": 0.825}, "own": {"point": 0.905},
                           "diff": {"diff": 0.08, "ci": [0.04, 0.132]},
                           "induced": {"count": 11}},
               "deep": {"n": 40, "real": {"point": 0.5}, "own": {"point": 0.6},
                        "compounding_share": {"point": 0.117, "ci": [0.034, 0.212]}}}
    _report("c", {"split": "dev"}, {"m": {"history": history}, "none": {"history": None}},
            (0.5, 0.5, 0.5))
    rows = json.loads((tmp_path / "c.json").read_text())["table"]["rows"]
    assert rows[0] == ["m", 137, "82.5%", "90.5%", "8.0%", "[+4.0%, +13.2%]", 11, 40, "50.0%",
                       "60.0%", "11.7%", "[+3.4%, +21.2%]"]
    assert rows[1] == ["none", None, "n/a", "n/a", "n/a", "n/a", None, None, "n/a", "n/a",
                       "n/a", "n/a"]


def test_compounding_of_models_all_kept_still_writes_its_result(tmp_path, monkeypatch):
    """A run whose every model's audit is kept under --keep probes nothing and still writes
    bench/results/<name>.json from those audits (it wrote nothing before 2026-12-08)."""
    import bench.machine
    from envace.core.layout import AUDIT
    from experiments.compounding import main

    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(bench.machine, "RESULTS", results)
    keep = tmp_path / "keep"
    history = {"overall": {"n": 3, "real": {"point": 0.5}, "own": {"point": 0.75},
                           "diff": {"diff": 0.25, "ci": [0.0, 0.5]}, "induced": {"count": 1}}}
    (keep / "m_plus_x").mkdir(parents=True)
    (keep / "m_plus_x" / AUDIT.summary).write_text(json.dumps(
        {"history": history, "seconds": 7.5, "resampling_unit": "scenario"}))
    assert main(["--models", "m + x=some/model", "--keep", str(keep), "--name", "c",
                 "--trajectories", "2"]) == 0
    got = json.loads((results / "c.json").read_text())
    assert got["models"]["m + x"]["kept"] is True
    assert got["models"]["m + x"]["history"] == history
    assert got["table"]["rows"][0][:4] == ["m + x", 3, "50.0%", "75.0%"]
