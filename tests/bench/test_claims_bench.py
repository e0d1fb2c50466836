"""experiments.claims: modes against their start and each other, seed by seed, task by task.

- `task_ci` and `across_seeds` (hypothesis and known answers): one seed's task bootstrap inside
  its data's range, widened for success differences (−1/0/+1) to McNemar's exact interval (known
  answers: 4 discordant tasks all one way hold zero, 8 do not); across seeds the mean of the
  seeds' means with a t interval (scipy's, df = seeds − 1) that is wider than the seeds' range
  with three seeds, and absent with one seed or with equal seed means;
- `main` on run directories written here (pure data: an evaluation file and a config each):
  pairs each run with the start of its own seed, compares two modes on the same tasks, refuses
  a glob that matches nothing or two runs of one seed; labels its columns with the split the
  runs were evaluated on (a pool: ``train``) and reports each run's training reward, first
  against last third of its steps (known answers; {} without rollouts).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.claims import across_seeds, exact_paired_ci, main, task_ci, train_reward

DIFFS = st.lists(st.lists(st.floats(-1, 1), min_size=1, max_size=8), min_size=1, max_size=4)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=1, max_size=12))
def test_task_ci_properties(diffs):
    got = task_ci(diffs, n_boot=200)
    assert got["mean"] == pytest.approx(sum(diffs) / len(diffs))
    assert got["lo"] <= got["mean"] <= got["hi"]
    if not all(d in (-1.0, 0.0, 1.0) for d in diffs):
        assert min(diffs) - 1e-9 <= got["lo"] <= got["hi"] <= max(diffs) + 1e-9
    assert got["tasks"] == len(diffs)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([-1.0, 0.0, 1.0]), min_size=1, max_size=60))
def test_task_ci_success_differences_hold_the_exact_interval(diffs):
    got = task_ci(diffs, n_boot=200)
    worse, better = diffs.count(-1.0), diffs.count(1.0)
    lo, hi = exact_paired_ci(worse, better, len(diffs))
    assert got["lo"] <= lo + 1e-12 and got["hi"] >= hi - 1e-12
    assert got["discordant"] == {"worse": worse, "better": better}
    assert -1.0 <= got["lo"] <= got["mean"] <= got["hi"] <= 1.0


def test_task_ci_success_known_answers():
    # 4 of 96 tasks worse, none better: McNemar's exact p = 0.125, so the interval holds zero
    # (a plain percentile bootstrap gives [-0.083, -0.010])
    four = task_ci([-1.0] * 4 + [0.0] * 92)
    assert four["lo"] < 0 < four["hi"]
    # 8 of 96 worse, none better: p = 0.0078, the interval lies below zero
    eight = task_ci([-1.0] * 8 + [0.0] * 88)
    assert eight["hi"] < 0
    # Clopper-Pearson upper bound of 0/8 is 1 - 0.025 ** (1/8) = 0.3694
    assert exact_paired_ci(8, 0, 96)[1] == pytest.approx(8 / 96 * (2 * 0.36942 - 1), abs=1e-4)
    # no discordant task: symmetric about zero, never zero width
    none = task_ci([0.0] * 20)
    assert none["lo"] < 0 < none["hi"] and none["lo"] == pytest.approx(-none["hi"])


@settings(max_examples=100, deadline=None)
@given(DIFFS)
def test_across_seeds_properties(diffs):
    got = across_seeds(diffs)
    means = [sum(d) / len(d) for d in diffs]
    assert got["mean"] == pytest.approx(sum(means) / len(means))
    assert got["per_seed"] == pytest.approx(means)
    assert got["positive_seeds"] == sum(m > 1e-9 for m in means)
    assert got["negative_seeds"] == sum(m < -1e-9 for m in means)
    assert got["positive_seeds"] + got["negative_seeds"] <= got["seeds"]
    if len(diffs) == 1:
        assert got["lo"] is None and got["hi"] is None
    elif got["lo"] is None:  # no spread: the seed means are equal (up to underflow)
        assert max(means) - min(means) < 1e-12 and "equal" in got["interval"]
    else:
        assert got["lo"] <= got["mean"] <= got["hi"]
        assert got["hi"] - got["mean"] == pytest.approx(got["mean"] - got["lo"])
        # up to four seeds, never narrower than the seeds' range (t(0.975, df) * sd / sqrt(n))
        assert got["hi"] - got["lo"] >= (max(means) - min(means)) - 1e-9


def test_across_seeds_known_answers():
    # equal seed means: no zero-width interval, and the reason given
    same = across_seeds([[0.2, 0.2], [0.1, 0.3]])
    assert same["mean"] == pytest.approx(0.2) and same["lo"] is None and same["hi"] is None
    assert "equal" in same["interval"]
    # seed means 0, 0.3, 0.6: sd 0.3, t(0.975, 2) = 4.3027, half width 4.3027 * 0.3 / sqrt 3
    spread = across_seeds([[0.0] * 20, [0.3] * 20, [0.6] * 20])
    assert spread["mean"] == pytest.approx(0.3)
    assert spread["hi"] - 0.3 == pytest.approx(4.302653 * 0.3 / 3 ** 0.5, rel=1e-5)
    assert spread["lo"] < 0.0 and spread["hi"] > 0.6  # wider than the seeds' range
    assert across_seeds([[], []])["mean"] is None
    assert task_ci([])["mean"] is None
    # a seed level with its start whose float mean is a rounding residue (0.1 + 0.2 - 0.3 is
    # 5.6e-17) counts as neither up nor down
    tie = across_seeds([[0.1, 0.2, -0.3], [0.1], [-0.2]])
    assert tie["per_seed"][0] != 0.0
    assert (tie["positive_seeds"], tie["negative_seeds"]) == (1, 1)


def _run(root, name, seed, rewards, split="dev", steps=()):
    run = root / name
    (run / "eval" / split).mkdir(parents=True)
    (run / "config.yaml").write_text(f"seed: {seed}\neval_split: {split}\nmode: grpo\n")
    for i, step in enumerate(steps):  # training rollouts, one reward per episode
        (run / "rollouts").mkdir(exist_ok=True)
        (run / "rollouts" / f"step_{i}.jsonl").write_text(
            "".join(json.dumps({"reward": r}) + "\n" for r in step))
    (run / "eval" / split / "trajectories.jsonl").write_text("".join(
        json.dumps({"task_id": t, "reward": r, "meta": {"success": r >= 1.0}}) + "\n"
        for t, r in rewards.items()))
    return run


def test_main_pairs_seeds_and_modes(tmp_path, monkeypatch):
    from bench import machine

    monkeypatch.setattr(machine, "RESULTS", tmp_path / "results")
    for s in (0, 1):
        tasks = {f"t{s}_{i}": 0.0 for i in range(4)}  # each seed evaluates its own tasks
        _run(tmp_path, f"base-s{s}", s, tasks)
        _run(tmp_path, f"a-s{s}", s, {t: 0.5 for t in tasks})
        _run(tmp_path, f"b-s{s}", s, {t: 0.25 + 0.5 * s for t in tasks})
    assert main(["--base", str(tmp_path / "base-s*"), "--mode", f"A={tmp_path}/a-s*",
                 "--mode", f"B={tmp_path}/b-s*", "--versus", "A:B", "--name", "c"]) == 0
    got = json.loads((tmp_path / "results" / "c.json").read_text())
    a, b = got["modes"]["A"], got["modes"]["B"]
    assert a["reward_diff"]["mean"] == pytest.approx(0.5) and a["reward_diff"]["lo"] is None
    assert "equal" in a["reward_diff"]["interval"]  # both seeds +0.5: no zero-width interval
    assert b["reward_diff"]["per_seed"] == pytest.approx([0.25, 0.75])
    assert got["versus"]["A:B"]["reward_diff"]["per_seed"] == pytest.approx([0.25, -0.25])
    assert got["versus"]["A:B"]["reward_diff"]["positive_seeds"] == 1
    assert got["versus"]["A:B"]["per_seed_tasks"]["1"]["mean"] == pytest.approx(-0.25)
    assert a["seeds"]["0"]["reward_diff"]["tasks"] == 4
    assert a["seeds"]["1"]["tasks"] == 4


def test_main_leaves_out_unfinished_runs(tmp_path, monkeypatch, capsys):
    from bench import machine

    monkeypatch.setattr(machine, "RESULTS", tmp_path / "results")
    _run(tmp_path, "base-s0", 0, {"t": 0.0})
    _run(tmp_path, "a-s0", 0, {"t": 1.0})
    going = _run(tmp_path, "a-s1", 1, {"t": 1.0})
    (going / "RUNNING").write_text("{}")
    (tmp_path / "a-s2").mkdir()
    (tmp_path / "a-s2" / "config.yaml").write_text("seed: 2\n")  # died before evaluating
    assert main(["--base", str(tmp_path / "base-s*"), "--mode", f"A={tmp_path}/a-s*",
                 "--name", "c"]) == 0
    got = json.loads((tmp_path / "results" / "c.json").read_text())
    assert list(got["modes"]["A"]["seeds"]) == ["0"]
    out = capsys.readouterr().out
    assert "a-s1: still running" in out and "a-s2: still running" in out


def test_main_refuses_bad_globs(tmp_path):
    _run(tmp_path, "base-s0", 0, {"t": 0.0})
    _run(tmp_path, "dup-1", 0, {"t": 0.0})
    _run(tmp_path, "dup-2", 0, {"t": 0.0})
    with pytest.raises(SystemExit):
        main(["--base", str(tmp_path / "nothing-*"), "--mode", f"A={tmp_path}/base-s*"])
    with pytest.raises(SystemExit):
        main(["--base", str(tmp_path / "base-s*"), "--mode", f"A={tmp_path}/dup-*"])
    with pytest.raises(SystemExit):
        main(["--base", str(tmp_path / "base-s*"), "--mode", f"A={tmp_path}/base-s*",
              "--versus", "A:Z"])


def test_train_reward_known_answer(tmp_path):
    # six steps: the first third is steps 0-1, the last steps 4-5
    steps = [[0.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.5, 0.5], [1.0, 1.0], [1.0, 0.5]]
    run = _run(tmp_path, "r", 0, {"t": 0.0}, steps=steps)
    got = train_reward(run)
    assert got["steps"] == 6
    assert got["first_third"] == pytest.approx(0.25) and got["last_third"] == pytest.approx(0.875)
    assert got["diff"] == pytest.approx(0.625) and got["lo"] <= 0.625 <= got["hi"]
    assert train_reward(_run(tmp_path, "none", 0, {"t": 0.0})) == {}


def test_main_on_a_pool_names_the_split_and_trains(tmp_path, monkeypatch, capsys):
    from bench import machine

    monkeypatch.setattr(machine, "RESULTS", tmp_path / "results")
    for s in (0, 1):
        tasks = {f"t{s}_{i}": 0.0 for i in range(4)}
        _run(tmp_path, f"base-s{s}", s, tasks, split="train")
        _run(tmp_path, f"a-s{s}", s, {t: 0.5 for t in tasks}, split="train",
             steps=[[0.0], [0.0], [0.0], [0.2 + 0.2 * s]])
    assert main(["--base", str(tmp_path / "base-s*"), "--mode", f"A={tmp_path}/a-s*",
                 "--name", "p"]) == 0
    got = json.loads((tmp_path / "results" / "p.json").read_text())
    assert got["eval_split"] == "train"
    a = got["modes"]["A"]
    assert a["seeds"]["0"]["eval_split"] == "train"
    assert a["seeds"]["1"]["train_reward"]["diff"] == pytest.approx(0.4)
    assert a["train_reward_diff"]["per_seed"] == pytest.approx([0.2, 0.4])
    out = capsys.readouterr().out
    assert "train reward" in out and "dev reward" not in out
