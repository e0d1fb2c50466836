"""bench.claims: modes against their start and each other, seed by seed, task by task.

- `hierarchical_ci` (hypothesis and known answers): the mean of the seeds' means, an interval
  inside the data's range that collapses where nothing varies and widens with seed spread;
- `main` on run directories written here (pure data: an evaluation file and a config each):
  pairs each run with the start of its own seed, compares two modes on the same tasks, refuses
  a glob that matches nothing or two runs of one seed.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.claims import hierarchical_ci, main

DIFFS = st.lists(st.lists(st.floats(-1, 1), min_size=1, max_size=8), min_size=1, max_size=4)


@settings(max_examples=100, deadline=None)
@given(DIFFS)
def test_hierarchical_ci_properties(diffs):
    got = hierarchical_ci(diffs, n_boot=200)
    means = [sum(d) / len(d) for d in diffs]
    assert got["mean"] == pytest.approx(sum(means) / len(means))
    lo_all, hi_all = min(min(d) for d in diffs), max(max(d) for d in diffs)
    assert lo_all - 1e-9 <= got["lo"] <= got["hi"] <= hi_all + 1e-9
    assert got["seeds"] == len(diffs)


def test_hierarchical_ci_known_answers():
    same = hierarchical_ci([[0.2, 0.2], [0.2]], n_boot=100)
    assert same["mean"] == pytest.approx(0.2) and same["lo"] == pytest.approx(0.2) \
        and same["hi"] == pytest.approx(0.2)
    # no spread within seeds, all of it between them: the interval spans the seeds
    spread = hierarchical_ci([[0.0] * 20, [0.3] * 20, [0.6] * 20], n_boot=2000)
    assert spread["mean"] == pytest.approx(0.3)
    assert spread["lo"] < 0.15 and spread["hi"] > 0.45
    assert hierarchical_ci([[], []])["mean"] is None


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
    assert a["seeds"]["1"]["tasks"] == 4


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
