"""Pooling rehearsal sweeps over sampling seeds (`experiments.sweep_seeds`): known answers,
refusals, and properties of the task-resampling interval."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import bench.machine
import experiments.sweep_seeds as ss


def _setting(rewards: dict[str, float]) -> dict:
    return {"per_attempt": [{"task": t, "seed": 0, "success": r >= 1, "reward": r}
                            for t, r in rewards.items()]}


def _sweep(seed: int | None, settings_: dict[str, dict[str, float]]) -> dict:
    res = {"tasks": 3, "reward": "action_partial", "max_turns": 4, "max_new_tokens": 96,
           "settings": {k: _setting(v) for k, v in settings_.items()}}
    if seed is not None:
        res["seed"] = seed
    return res


NONE0 = {"a": 0.0, "b": 0.5, "c": 1.0}
NONE1 = {"a": 0.2, "b": 0.5, "c": 0.0}


def test_known_answer_pooled_and_per_seed():
    s0 = _sweep(None, {"m/none/0": NONE0, "m/parallel/1": {"a": 0.5, "b": 0.5, "c": 1.0},
                       "m/parallel/1/oracle": {"a": 1.0, "b": 1.0, "c": 1.0}})
    s1 = _sweep(1, {"m/none/0": NONE1, "m/parallel/1": {"a": 0.2, "b": 0.2, "c": 0.0},
                    "m/parallel/1/oracle": {"a": 0.2, "b": 0.8, "c": 0.6}})
    out = ss.summarise(ss.by_seed([s0, s1]), [("oracle", "self")])
    own = out["vs_none"]["m/parallel/1"]
    # seed 0: +0.5, 0, 0 -> 1/6; seed 1: 0, -0.3, 0 -> -0.1; pooled over 6 pairs: 0.2/6
    assert own["per_seed"] == pytest.approx({0: 0.5 / 3, 1: -0.1})
    assert own["mean"] == pytest.approx(0.2 / 6) and own["tasks"] == 3 and own["n"] == 6
    assert own["seeds"] == [0, 1] and own["world"] == "self"
    oracle = out["vs_none"]["m/parallel/1/oracle"]
    assert oracle["mean"] == pytest.approx((1.0 + 0.5 + 0.0 + 0.0 + 0.3 + 0.6) / 6)
    vs = out["versus"]["m/parallel/1/oracle - m/parallel/1"]
    assert vs["mean"] == pytest.approx((0.5 + 0.5 + 0.0 + 0.0 + 0.6 + 0.6) / 6)
    assert vs["ci"][0] <= vs["mean"] <= vs["ci"][1]
    assert "m/none/0" not in out["vs_none"]


def test_one_seed_in_two_files_merges_and_a_disagreement_is_refused():
    a = _sweep(None, {"m/none/0": NONE0, "m/parallel/1": NONE0})
    b = _sweep(0, {"m/none/0": NONE0, "m/parallel/2/hybrid": NONE0})
    merged = ss.by_seed([a, b])
    assert set(merged) == {0} and set(merged[0]) == {"m/none/0", "m/parallel/1",
                                                      "m/parallel/2/hybrid"}
    bad = _sweep(0, {"m/none/0": {**NONE0, "a": 0.3}})
    with pytest.raises(ValueError, match="disagree"):
        ss.by_seed([a, bad])
    other = {**_sweep(1, {"m/none/0": NONE1}), "max_turns": 6}
    with pytest.raises(ValueError, match="different settings"):
        ss.by_seed([a, other])
    fewer = _sweep(1, {"m/none/0": NONE1, "m/parallel/1": {"a": 0.0, "b": 0.0}})
    with pytest.raises(ValueError, match="different tasks"):
        ss.summarise(ss.by_seed([fewer]), [])


def test_keys_and_worlds():
    assert ss.split_key("base/parallel/3") == ("base", "parallel", 3, "self")
    assert ss.split_key("base/sequential/2/oracle") == ("base", "sequential", 2, "oracle")


rewards = st.floats(0, 1, allow_nan=False, width=32)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(rewards, rewards), min_size=2, max_size=12), st.randoms())
@example([(1.0, 0.0), (1.0, 0.0)], random.Random(0))  # found: a rate's fallback for −1
def test_the_pooled_mean_ignores_task_order_and_sits_in_its_interval(pairs, rnd):
    tasks = [f"t{i}" for i in range(len(pairs))]
    none = {t: a for t, (a, _) in zip(tasks, pairs, strict=True)}
    par = {t: b for t, (_, b) in zip(tasks, pairs, strict=True)}
    order = tasks[:]
    rnd.shuffle(order)
    shuffled = _sweep(0, {"m/none/0": {t: none[t] for t in order},
                          "m/parallel/1": {t: par[t] for t in order}})
    plain = _sweep(0, {"m/none/0": none, "m/parallel/1": par})
    x = ss.summarise(ss.by_seed([plain]), [])["vs_none"]["m/parallel/1"]
    y = ss.summarise(ss.by_seed([shuffled]), [])["vs_none"]["m/parallel/1"]
    want = sum(b - a for a, b in pairs) / len(pairs)
    assert x["mean"] == pytest.approx(want, abs=1e-9) and y["mean"] == pytest.approx(want,
                                                                                      abs=1e-9)
    if x["ci"] is None:  # only when every task's difference is the same
        assert len({round(b - a, 9) for a, b in pairs}) == 1 and "no spread" in x["method"]
    else:
        assert x["ci"][0] - 1e-9 <= x["mean"] <= x["ci"][1] + 1e-9


def test_no_interval_when_every_task_moved_alike():
    same = _sweep(0, {"m/none/0": NONE0, "m/parallel/1": NONE0})  # rehearsal changed nothing
    r = ss.summarise(ss.by_seed([same]), [])["vs_none"]["m/parallel/1"]
    assert r["mean"] == 0.0 and r["ci"] is None and "no spread" in r["method"]
    assert ss._fmt(r) == "+0.000"
    worse = _sweep(0, {"m/none/0": {"a": 1.0, "b": 1.0, "c": 1.0},
                       "m/parallel/1": {"a": 0.0, "b": 0.0, "c": 0.0}})
    r = ss.summarise(ss.by_seed([worse]), [])["vs_none"]["m/parallel/1"]
    assert r["mean"] == -1.0 and r["ci"] is None


def test_the_cli_writes_its_table_and_refuses_a_missing_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ss, "RESULTS", tmp_path)
    monkeypatch.setattr(bench.machine, "RESULTS", tmp_path)
    (tmp_path / "s0.json").write_text(json.dumps(_sweep(0, {
        "m/none/0": NONE0, "m/parallel/1/oracle": {"a": 1.0, "b": 1.0, "c": 1.0}})))
    assert ss.main(["s0", "--name", "pooled"]) == 0
    out = capsys.readouterr().out
    assert "| m | oracle | parallel | 1 | +0.500" in out
    saved = json.loads((tmp_path / "pooled.json").read_text())
    assert saved["inputs"] == ["s0"] and "m/parallel/1/oracle" in saved["vs_none"]
    assert ss.main(["missing"]) == 2
    assert ss.main(["s0", "--versus", "oracle"]) == 2
