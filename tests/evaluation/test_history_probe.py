"""The self-conditioned probe (audit.probe, history="own") on real BFCL trajectories, with
scripted world models of pure logic (named as such: they are the known answers).

- a model that copies the real response while every earlier response it sees is real, is wrong
  at one hard step, and is wrong after any wrong response in its history: with the real history
  it diverges at the hard step only; with its own history, from the hard step on;
- a model that ignores the history entirely: both probes give identical verdicts.
"""

from __future__ import annotations

import pytest

from audit.probe import probe_trajectory
from audit.scoring.settings import AuditOptions
from audit.stats.history import decompose, pair_verdicts
from audit.stats.intervals import IntervalSpec
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real

HARD = 1  # the step index at which the scripted model errs whatever its history


@pytest.fixture(scope="module")
def trajectories():
    trajs = [t for t in export_real(split_tasks("dev")[:30]) if len(t.tool_steps()) >= 4]
    assert len(trajs) >= 3
    return trajs[:5]


def _truth(traj) -> list[str]:
    recs = probe_trajectory(traj, lambda *a: "x", AuditOptions()).steps
    return [r["actual"] for r in sorted(recs, key=lambda r: r["step"])]


def _compounding_model(truth: list[str]):
    """Scripted (pure logic): right while its history is real, except at step HARD."""

    def model(messages, tools, tool, arguments):
        seen = [m["content"] for m in messages if m["role"] == "tool"]
        k = len(seen)
        if k == HARD or seen != truth[:k]:
            return "WRONG"
        return truth[k]

    return model


def _verdicts(traj, model, history):
    recs = probe_trajectory(traj, model, AuditOptions(), history=history).steps
    assert all(r["history"] == history for r in recs)
    return [r["diverged"] for r in sorted(recs, key=lambda r: r["step"])]


def test_compounding_model_gives_the_induced_pattern_exactly(trajectories):
    real_rows, own_rows = [], []
    for traj in trajectories:
        truth = _truth(traj)
        model = _compounding_model(truth)
        n = len(truth)
        assert _verdicts(traj, model, "real") == [i == HARD for i in range(n)]
        assert _verdicts(traj, model, "own") == [i >= HARD for i in range(n)]
        for history, rows in (("real", real_rows), ("own", own_rows)):
            rows += probe_trajectory(traj, model, AuditOptions(), history=history).steps
    block = decompose(pair_verdicts(real_rows, own_rows), IntervalSpec(200, 0))
    steps = sum(len(_truth(t)) for t in trajectories)
    o = block["overall"]
    assert o["diverged_real"] == len(trajectories)
    assert o["diverged_own"] == steps - HARD * len(trajectories)
    assert o["induced"]["count"] == o["diverged_own"] - o["diverged_real"]
    assert o["recovered"]["count"] == 0
    assert block["deep"]["compounding_share"]["point"] == 1.0


def test_history_blind_model_shows_no_difference(trajectories):
    def blind(messages, tools, tool, arguments):  # scripted: a function of the call alone
        return "ok" if len(str(arguments)) % 2 else "nope"

    for traj in trajectories:
        assert _verdicts(traj, blind, "real") == _verdicts(traj, blind, "own")


def test_own_history_shows_the_models_answers(trajectories):
    traj = trajectories[0]
    seen: list[list[str]] = []

    def spy(messages, tools, tool, arguments):
        seen.append([m["content"] for m in messages if m["role"] == "tool"])
        return f"answer{len(seen)}"

    probe_trajectory(traj, spy, AuditOptions(), history="own")
    assert seen[2] == ["answer1", "answer2"]
    with pytest.raises(ValueError):
        probe_trajectory(traj, spy, AuditOptions(), history="imagined")


@pytest.mark.parametrize("history", ["real", "own"])
def test_batched_rounds_equal_one_at_a_time(trajectories, history):
    """probe_batched (rounds across trajectories, what local models and endpoints use) gives
    the records of probing each trajectory alone, for both histories; Unanswered stays a step."""
    from audit.probe import probe_batched
    from envace.core.worldmodel import Unanswered

    def model(messages, tools, tool, arguments):  # scripted: depends on the history it sees
        seen = [m["content"][:3] for m in messages if m["role"] == "tool"]
        if len(seen) == 2:
            raise Unanswered("timed out")
        return f"{tool}:{len(seen)}:{'|'.join(seen)}"

    def batch(requests):
        out = []
        for r in requests:
            try:
                out.append(model(*r))
            except Unanswered as exc:
                out.append(exc)
        return out

    sizes = []
    one = [probe_trajectory(t, model, AuditOptions(), history=history).steps
           for t in trajectories]
    many = probe_batched(trajectories, lambda rs: sizes.append(len(rs)) or batch(rs),
                         AuditOptions(), history=history)
    assert [m.steps for m in many] == one
    assert sizes[0] == len(trajectories) and max(sizes) == len(trajectories)
    assert any(r.get("unanswered_reason") == "timed out" for rows in one for r in rows)


def _compounding_source(trajectories, tmp_path):
    """The trajectories in a file, and the compounding model over all of them (scripted: it
    knows which trajectory it is in from the first user message)."""
    from envace.core.schema import TrajectoryWriter

    src = tmp_path / "dev.jsonl"
    truths = {}  # the first user message of each trajectory -> its real responses
    with TrajectoryWriter(src, mode="w") as w:
        for t in trajectories:
            w.write(t)
            first = next(m.content for m in t.messages if m.role == "user")
            truths[first] = _truth(t)

    def model(messages, tools, tool, arguments):
        truth = truths[next(m["content"] for m in messages if m["role"] == "user")]
        seen = [m["content"] for m in messages if m["role"] == "tool"]
        k = len(seen)
        if k == HARD or seen != truth[:k]:
            return "WRONG"
        return truth[k]

    return src, model, truths


def test_both_histories_in_one_audit_directory(trajectories, tmp_path, monkeypatch):
    """run_probe(histories=("real", "own")): one directory, both verdicts per step, statistics
    over the real-history rows (equal to a teacher-forced probe), the decomposition in the
    summary and the report (with its plot); rescore keeps it; compare shows both sides."""
    import json

    import audit.stats.summary
    from audit.compare import compare_audits, render_compare
    from audit.probe import run_probe
    from audit.rescore import rescore
    from audit.scoring.settings import AuditOptions

    monkeypatch.setattr(audit.stats.summary, "N_BOOT", 50)
    src, model, truths = _compounding_source(trajectories, tmp_path)
    opts = AuditOptions(progress=False, plots=True)
    both = run_probe([str(src)], tmp_path / "both", model, opts, histories=("real", "own"))
    real = run_probe([str(src)], tmp_path / "real", model, opts)
    assert both["probe"] == "teacher_forced+self_conditioned"
    assert both["histories"] == ["real", "own"]
    assert both["divergence_rate"] == real["divergence_rate"]
    assert both["by_depth"] == real["by_depth"]
    rows = [json.loads(x) for x in (tmp_path / "both" / "steps.jsonl").read_text().splitlines()]
    n = sum(len(v) for v in truths.values())
    assert len(rows) == 2 * n and {r["history"] for r in rows} == {"real", "own"}
    assert both["counts"]["own_history_steps"] == n and both["counts"]["steps"] == n
    h = both["history"]["overall"]
    assert h["diverged_real"] == len(trajectories)
    assert h["induced"]["count"] == n - 2 * len(trajectories)
    report = (tmp_path / "both" / "report.md").read_text()
    assert "Real vs own history" in report and (tmp_path / "both" / "history.png").is_file()
    again = rescore(tmp_path / "both", tmp_path / "rescored", opts)
    assert again["history"]["overall"] == both["history"]["overall"]
    # what was audited survives a rescore (it used to drop the probe's description)
    assert again["probe"] == both["probe"] and again["histories"] == ["real", "own"]
    c = compare_audits(tmp_path / "real", tmp_path / "both")
    assert c["divergence_rate"]["diff"] == 0.0
    assert c["history"]["a"] is None and c["history"]["b"]["own"] > c["history"]["b"]["real"]
    assert "own − real" in render_compare(c)


def test_a_world_model_that_raises_costs_its_trajectory_only(trajectories, tmp_path):
    """Even a StopIteration from the world model is that trajectory's failure, named."""
    from audit.probe import run_probe
    from audit.scoring.settings import AuditOptions
    from envace.core.schema import TrajectoryWriter

    src = tmp_path / "dev.jsonl"
    with TrajectoryWriter(src, mode="w") as w:
        for t in trajectories[:2]:
            w.write(t)
    calls = []

    def flaky(messages, tools, tool, arguments):  # scripted: fails on the very first call
        calls.append(tool)
        if len(calls) == 1:
            raise StopIteration
        return "{}"

    s = run_probe([str(src)], tmp_path / "o", flaky, AuditOptions(progress=False, plots=False),
                  histories=("own",))
    assert s["counts"]["trajectories"] == 1 and s["counts"]["skipped"] == 1
    assert "StopIteration" in s["skipped_records"][0]["reason"]
    assert s["probe"] == "self_conditioned"


def test_duplicate_trajectory_ids_are_skipped_not_paired_together(trajectories, tmp_path):
    """Pairing is by (trajectory id, step): a second trajectory with an id already probed is
    skipped with the reason (as `envace-audit` does), never merged into the first's pairs."""
    from audit.probe import run_probe
    from audit.scoring.settings import AuditOptions
    from envace.core.schema import TrajectoryWriter

    first, other = trajectories[0], trajectories[1]
    src = tmp_path / "dev.jsonl"
    with TrajectoryWriter(src, mode="w") as w:
        for t in (first, first, other.model_copy(update={"id": first.id}), other):
            w.write(t)
    s = run_probe([str(src)], tmp_path / "o", lambda *a: "{}",
                  AuditOptions(progress=False, plots=False), histories=("real", "own"))
    c = s["counts"]
    assert c["records_read"] == 4 and c["trajectories"] == 2 and c["skipped"] == 2 \
        and s["reconciles"]
    assert all("duplicate trajectory id" in r["reason"] for r in s["skipped_records"])
    n = len(first.tool_steps()) + len(other.tool_steps())
    assert c["steps"] == c["own_history_steps"] == s["history"]["pairs"] == n
    assert s["history"]["overall"]["trajectories"] == 2
    limited = run_probe([str(src)], tmp_path / "l", lambda *a: "{}",
                        AuditOptions(progress=False, plots=False), limit=2,
                        histories=("real", "own"))
    # --limit counts trajectories probed: the skipped duplicates are not among them
    assert limited["counts"]["trajectories"] == 2 and limited["counts"]["skipped"] == 2


def test_envace_probe_history_both_with_a_local_model(trajectories, tmp_path):
    """`envace probe --history both` on a real (tiny, untrained) model: batched rounds."""
    import json
    import subprocess
    import sys

    from envace.core.schema import TrajectoryWriter
    from envace.model.models import build_tiny
    from envace.training.sft import training_texts

    model_dir = build_tiny(training_texts(list(export_real(split_tasks("train")[:4]))),
                           tmp_path / "tiny")
    src = tmp_path / "dev.jsonl"
    with TrajectoryWriter(src, mode="w") as w:
        for t in trajectories[:2]:
            w.write(t)
    out = tmp_path / "probe"
    r = subprocess.run([sys.executable, "-m", "envace.cli", "probe", "--model", str(model_dir),
                        str(src), "--out", str(out), "--max-new-tokens", "4", "--history",
                        "both"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    n = summary["counts"]["steps"]
    assert summary["history"]["pairs"] == n == summary["counts"]["own_history_steps"] > 0
    assert "history: divergence real" in r.stdout


def test_envace_probe_refuses_hostile_usage_with_exit_2(tmp_path):
    """A refused --out (a file, a foreign directory) and a negative --limit: one line, exit 2,
    nothing written (README "exit codes"), not a traceback and 1 / a silent empty audit."""
    import subprocess
    import sys

    src = tmp_path / "dev.jsonl"
    src.write_text("")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x.txt").write_text("mine")
    base = [sys.executable, "-m", "envace.cli", "probe", "--model", "data/models/tiny-sft",
            str(src), "--max-new-tokens", "4", "--history", "both", "--quiet"]
    for extra, says in ((["--out", str(src)], "not a directory"),
                        (["--out", str(foreign)], "refusing to write into"),
                        (["--out", str(tmp_path / "o"), "--limit", "-1"], "--limit")):
        r = subprocess.run(base + extra, capture_output=True, text=True)
        assert r.returncode == 2, (extra, r.stderr[-2000:])
        assert says in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists() and sorted(p.name for p in foreign.iterdir()) == ["x.txt"]


def test_fidelity_page_shows_real_vs_own_history(trajectories, tmp_path, monkeypatch):
    """The dashboard's Fidelity page on a --history both audit: the tab's figures and chart
    are the summary's history block (a real Streamlit AppTest)."""
    import audit.stats.summary
    from audit.probe import run_probe
    from audit.scoring.settings import AuditOptions
    from tests.dashboard.test_dashboard import charts, metrics, open_page, pct

    monkeypatch.setattr(audit.stats.summary, "N_BOOT", 50)
    src, model, _ = _compounding_source(trajectories, tmp_path)
    s = run_probe([str(src)], tmp_path / "both", model, AuditOptions(progress=False, plots=False),
                  histories=("real", "own"))
    at = open_page(monkeypatch, tmp_path / "both", "fidelity")
    m = metrics(at)
    o = s["history"]["overall"]
    assert m["Divergence, real history"] == pct(o["real"]["point"])
    assert m["Divergence, own history"] == pct(o["own"]["point"])
    assert m["Own − real"] == pct(o["diff"]["diff"])
    drawn = charts(at)["The same calls, real vs own history"][0]
    own = drawn[drawn["history"] == "own history"].set_index("depth")
    for r in s["history"]["by_depth"]:
        assert own.loc[r["depth"], "divergence_rate"] == pytest.approx(r["own"]["point"])
