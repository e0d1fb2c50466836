"""bench.claims: modes against their start and each other, seed by seed, task by task.

- `task_ci` and `across_seeds` (hypothesis and known answers): one seed's task bootstrap inside
  its data's range; across seeds the mean of the seeds' means with a t interval (scipy's, df =
  seeds − 1) that collapses where the seeds agree, is wider than the seeds' range with three
  seeds, and is absent with one;
- `main` on run directories written here (pure data: an evaluation file and a config each):
  pairs each run with the start of its own seed, compares two modes on the same tasks, refuses
  a glob that matches nothing or two runs of one seed.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.claims import across_seeds, main, task_ci

DIFFS = st.lists(st.lists(st.floats(-1, 1), min_size=1, max_size=8), min_size=1, max_size=4)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=1, max_size=12))
def test_task_ci_properties(diffs):
    got = task_ci(diffs, n_boot=200)
    assert got["mean"] == pytest.approx(sum(diffs) / len(diffs))
    assert min(diffs) - 1e-9 <= got["lo"] <= got["hi"] <= max(diffs) + 1e-9
    assert got["tasks"] == len(diffs)


@settings(max_examples=100, deadline=None)
@given(DIFFS)
def test_across_seeds_properties(diffs):
    got = across_seeds(diffs)
    means = [sum(d) / len(d) for d in diffs]
    assert got["mean"] == pytest.approx(sum(means) / len(means))
    assert got["per_seed"] == pytest.approx(means)
    assert got["positive_seeds"] == sum(m > 0 for m in means)
    if len(diffs) == 1:
        assert got["lo"] is None and got["hi"] is None
    else:
        assert got["lo"] <= got["mean"] <= got["hi"]
        assert got["hi"] - got["mean"] == pytest.approx(got["mean"] - got["lo"])
        # up to four seeds, never narrower than the seeds' range (t(0.975, df) * sd / sqrt(n))
        assert got["hi"] - got["lo"] >= (max(means) - min(means)) - 1e-9


def test_across_seeds_known_answers():
    same = across_seeds([[0.2, 0.2], [0.1, 0.3]])
    assert same["mean"] == pytest.approx(0.2) and same["lo"] == pytest.approx(0.2) \
        and same["hi"] == pytest.approx(0.2)
    # seed means 0, 0.3, 0.6: sd 0.3, t(0.975, 2) = 4.3027, half width 4.3027 * 0.3 / sqrt 3
    spread = across_seeds([[0.0] * 20, [0.3] * 20, [0.6] * 20])
    assert spread["mean"] == pytest.approx(0.3)
    assert spread["hi"] - 0.3 == pytest.approx(4.302653 * 0.3 / 3 ** 0.5, rel=1e-5)
    assert spread["lo"] < 0.0 and spread["hi"] > 0.6  # wider than the seeds' range
    assert across_seeds([[], []])["mean"] is None
    assert task_ci([])["mean"] is None


def _run(root, name, seed, rewards):
    run = root / name
    (run / "eval" / "dev").mkdir(parents=True)
    (run / "config.yaml").write_text(f"seed: {seed}\neval_split: dev\nmode: grpo\n")
    (run / "eval" / "dev" / "trajectories.jsonl").write_text("".join(
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
    assert a["reward_diff"]["mean"] == pytest.approx(0.5) and a["reward_diff"]["lo"] == \
        pytest.approx(0.5)
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
