"""Audit statistics count rehearsed steps only (issue #13): known answers through the real replay.

Per-turn tasks carry the earlier turns' ground-truth calls as real history (``"rehearsed":
false``) before the policy's rehearsed steps. Every figure of the audit, of ``compare``, of the
trainer's ``fidelity/*`` metrics and of the dashboard must count the rehearsed steps only, depth 0
being each trajectory's first rehearsed step; the real steps are a determinism check.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit.compare import compare_audits, render_compare
from audit.pipeline import run_audit
from audit.rescore import rescore, summary_from_steps
from audit.scoring.settings import AuditOptions
from audit.store.models import AuditSummary
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.core.schema import Trajectory, TrajectoryWriter

QUIET = {"progress": False, "plots": False}


def _history_then_two_rehearsed(n: int = 10) -> list[Trajectory]:
    """Real trajectories with >= 4 calls: all real but the last two calls, which are rehearsed;
    the last one wrong. Every trajectory: 2+ real steps, then depth 0 right, depth 1 wrong."""
    out = []
    for t in export_real(split_tasks("dev")):
        steps = t.tool_steps()
        if len(steps) < 4:
            continue
        for st in steps[-2:]:
            st.response.rehearsed = True
        steps[-1].response.content = json.dumps({"rehearsed": "a wrong guess"})
        out.append(t)
        if len(out) == n:
            break
    assert len(out) == n
    return out


def _write(path: Path, trajs: list[Trajectory]) -> Path:
    with TrajectoryWriter(path, mode="w") as w:
        for t in trajs:
            w.write(t)
    return path


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> tuple[Path, Path, dict]:
    d = tmp_path_factory.mktemp("mixed")
    src = _write(d / "mixed.jsonl", _history_then_two_rehearsed())
    s = run_audit([str(src)], d / "audit", AuditOptions(**QUIET))
    return src, d / "audit", s


def test_history_then_two_rehearsed_audits_to_exactly_half(mixed):
    _, out, s = mixed
    assert s["divergence_rate"] == 0.5  # pooled with the real history it was about 17 %
    assert s["counts"]["scored_steps"] == 20 and s["counts"]["real_steps"] > 20
    assert s["statistics"]["population"] == "rehearsed" and not s["determinism_check"]
    assert s["statistics"]["real_steps_excluded"] == s["counts"]["real_steps"]
    assert [(r["depth"], r["n"], r["diverged"]) for r in s["by_depth"]] == [(0, 10, 0),
                                                                          (1, 10, 10)]
    assert s["scores"]["exact"]["mean"] == 0.5
    assert s["by_source"]["rehearsed"]["divergence_rate"] == 0.5
    assert s["by_source"]["real"]["diverged"] == 0 and s["determinism_warning"] is None
    # every trajectory half wrong: no between-trajectory spread -> Wilson on 10 trajectories
    assert s["divergence_ci_method"] == "wilson_trajectories"
    assert s["interval"]["method"] == "trajectory_bootstrap" and s["interval"]["seed"] == 0
    # the first divergence is at depth 1 in every trajectory; nothing follows it
    km = s["first_divergence"]
    assert [(r["depth"], r["events"]) for r in km["rows"]] == [(0, 0), (1, 10)]
    assert s["median_first_divergence"] == 1
    t = s["compounding"]["table"]
    assert t == {"prior_diverged": 0, "prior_matched": 0, "no_prior_diverged": 10,
                 "no_prior_matched": 0}
    assert s["compounding"]["ratio"] is None  # no step follows a divergence
    assert s["error_prediction"]["actual_errors"] == 0
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert {r["depth"] for r in steps if r["source_rehearsed"]} == {0, 1}
    assert all(r["depth"] is None for r in steps if not r["source_rehearsed"])
    rows = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert all(r["rehearsed_steps"] == 2 and r["first_divergence_depth"] == 1 for r in rows)
    report = (out / "report.md").read_text()
    assert "Statistics over the 20 answered rehearsed steps" in report


def test_unmarked_responses_count_as_rehearsed(tmp_path):
    trajs = _history_then_two_rehearsed(4)
    for t in trajs:
        for st in t.tool_steps()[-2:]:
            st.response.rehearsed = None  # another simulator's file: no flag
    s = run_audit([str(_write(tmp_path / "u.jsonl", trajs))], tmp_path / "a", AuditOptions(**QUIET))
    assert s["divergence_rate"] == 0.5 and s["counts"]["unmarked_steps"] == 8
    assert s["statistics"]["unmarked_steps_counted_as_rehearsed"] == 8
    assert "counted as rehearsed" in (tmp_path / "a" / "report.md").read_text()


def test_real_only_file_is_a_determinism_check(tmp_path):
    trajs = list(export_real(split_tasks("dev")[:5]))
    s = run_audit([str(_write(tmp_path / "r.jsonl", trajs))], tmp_path / "a", AuditOptions(**QUIET))
    assert s["determinism_check"] and s["statistics"]["population"] == "determinism_check"
    assert s["divergence_rate"] == 0 and s["counts"]["scored_steps"] == s["counts"]["real_steps"]
    assert s["by_depth"][0]["depth"] == 0
    assert "Determinism check" in (tmp_path / "a" / "report.md").read_text()


def test_a_diverging_real_step_is_a_warning(tmp_path):
    trajs = _history_then_two_rehearsed(3)
    trajs[0].tool_steps()[0].response.content = "not what the environment says"
    s = run_audit([str(_write(tmp_path / "w.jsonl", trajs))], tmp_path / "a", AuditOptions(**QUIET))
    assert s["by_source"]["real"]["diverged"] == 1
    assert trajs[0].id in s["determinism_warning"]
    assert s["divergence_rate"] == 0.5  # the fidelity figures are unchanged
    assert "**Warning:**" in (tmp_path / "a" / "report.md").read_text()


def _make_old(src: Path, dst: Path) -> Path:
    """An audit directory as the first summary format left it: no depth, schema /1."""
    dst.mkdir()
    rows = [json.loads(x) for x in (src / "steps.jsonl").read_text().splitlines()]
    (dst / "steps.jsonl").write_text("".join(
        json.dumps({k: v for k, v in r.items() if k != "depth"}) + "\n" for r in rows))
    old = json.loads((src / "summary.json").read_text())
    old["schema"] = "envace.audit/1"
    (dst / "summary.json").write_text(json.dumps(old))
    return dst


def test_rescore_and_recompute_derive_depth_for_older_files(mixed, tmp_path):
    _, out, s = mixed
    old = _make_old(out, tmp_path / "old")
    again = summary_from_steps(old, logistic_boot=200)
    for key in ("divergence_rate", "divergence_ci", "by_depth", "by_tool", "scores",
                "compounding", "first_divergence", "statistics", "by_source"):
        assert again[key] == s[key], key
    assert again["recomputed_from"]["old_schema"] == "envace.audit/1"
    new = rescore(old, tmp_path / "re", AuditOptions(**QUIET))
    assert new["by_depth"] == s["by_depth"] and new["divergence_rate"] == 0.5
    rows = [json.loads(x) for x in (tmp_path / "re" / "steps.jsonl").read_text().splitlines()]
    assert {r["depth"] for r in rows if r["source_rehearsed"]} == {0, 1}


def test_compare_counts_rehearsed_steps_and_says_its_design(mixed, tmp_path):
    src, out, _ = mixed
    old = _make_old(out, tmp_path / "old")  # the same trajectories: paired by trajectory
    c = compare_audits(old, out)
    assert c["design"] == "paired_by_trajectory"
    assert c["steps"] == {"a": 20, "b": 20}
    dr = c["divergence_rate"]
    assert dr["a"] == dr["b"] == 0.5 and dr["diff"] == 0 and dr["p_value"] == 1.0
    assert c["paired"]["pairs"] == 20
    # the same steps on both sides: the exact cluster sign-flip test, BFCL's scenarios the unit
    assert dr["test"] == c["paired"]["test"] == "exact_cluster_sign_flip"
    assert c["resampling_unit"] == "scenario"
    assert c["clusters"]["a"] <= c["trajectories"]["a"]
    assert c["paired"]["mcnemar_exact_p"] == 1.0  # no discordant call
    by_traj = compare_audits(old, out, cluster_by="trajectory")
    assert by_traj["resampling_unit"] == "trajectory"
    assert by_traj["clusters"]["a"] == by_traj["trajectories"]["a"]
    # another set of trajectories: independent resampling
    other = _write(tmp_path / "o.jsonl", _history_then_two_rehearsed(14)[10:])
    run_audit([str(other)], tmp_path / "o", AuditOptions(**QUIET))
    c2 = compare_audits(out, tmp_path / "o")
    assert c2["design"] == "independent" and c2["trajectories"] == {"a": 10, "b": 4}
    assert "independent" in render_compare(c2)


# ------------------------------------------------ the trainer's metrics and the dashboard agree


def _rollouts(n: int = 12) -> list[Trajectory]:
    """Per-turn-like rollouts: one or two real history calls, then rehearsed ones, some wrong."""
    import random

    rnd = random.Random(7)
    out = []
    for t in export_real(split_tasks("dev")):
        steps = t.tool_steps()
        if len(steps) < 4:
            continue
        for st in steps[1 + len(out) % 2:]:
            st.response.rehearsed = True
            if rnd.random() < 0.35:
                st.response.content = json.dumps({"guess": st.step})
        t.id = f"s3-{len(out)}-{t.task_id}"
        out.append(t)
        if len(out) == n:
            return out
    raise AssertionError("not enough dev tasks with four calls")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> tuple[Path, dict]:
    """A training run's step 3 made by the trainer's own fidelity code (training.fidelity)."""
    from envace.training.fidelity import audit_rollouts, fidelity_metrics

    root = tmp_path_factory.mktemp("runs")
    run = root / "r"
    trajs = _rollouts()
    rollout_file = _write(run / "rollouts" / "step_3.jsonl", trajs)
    scorers = ["exact", "json_f1"]
    rows, _ = audit_rollouts(trajs, scorers, "exact", None)  # as train_step: metrics first
    audit_rollouts(trajs, scorers, "exact", run / "audit" / "step_3", str(rollout_file))
    record = {"step": 3, "reward/mean": 0.5, **fidelity_metrics(rows, scorers)}
    (run / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    return root, record


def _check_agreement(s: AuditSummary, record: dict) -> None:
    assert s.divergence_rate == pytest.approx(record["fidelity/divergence_rate"])
    assert s.counts.scored_steps == record["fidelity/steps"]
    for name in ("exact", "json_f1"):
        assert s.scores[name].mean == pytest.approx(record[f"fidelity/{name}"])
    for r in s.by_depth:
        if r.depth < 8:
            assert r.divergence_rate == pytest.approx(record[f"fidelity/depth_{r.depth}"])
    assert s.by_depth[0].depth == 0 and "fidelity/depth_0" in record


def test_metrics_and_dashboard_agree_for_the_same_step(run_dir, monkeypatch):
    from dashboard import data
    from dashboard.runs import discover

    root, record = run_dir
    assert 0 < record["fidelity/divergence_rate"] < 1
    run = next(r for r in discover(root) if r.name == "r")
    (audit,) = run.audits
    s, err = data.summary(audit.path)
    assert err is None and not s.recomputed_from
    _check_agreement(s, record)
    logged = data.metrics(run.metrics).frame.set_index("step")
    trend = data.audit_trend(run.audits).set_index("step")
    assert trend.loc[3, "divergence_rate"] == pytest.approx(
        logged.loc[3, "fidelity/divergence_rate"])
    assert trend.loc[3, "steps"] == record["fidelity/steps"]
    # the Fidelity page shows the same figure
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("ENVACE_DASHBOARD_ROOT", str(root))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py"),
                           default_timeout=120)
    at.query_params["run"] = "r"
    at.run()
    at.switch_page("views/fidelity.py").run()
    assert not at.exception, [e.value for e in at.exception]
    shown = {m.label: m.value for m in at.metric}
    assert shown["Divergence rate"] == f"{record['fidelity/divergence_rate']:.1%}"
    assert shown["Rehearsed tool calls"] == str(record["fidelity/steps"])


def test_an_older_step_audit_is_recomputed_to_agree(run_dir, tmp_path):
    from dashboard import readers

    root, record = run_dir
    old = _make_old(root / "r" / "audit" / "step_3", tmp_path / "old")
    stale = json.loads((old / "summary.json").read_text())
    stale["divergence_rate"] = 0.123  # what a pooled summary would say
    (old / "summary.json").write_text(json.dumps(stale))
    s, err = readers.audit_summary(old)
    assert err is None and s.recomputed_from["old_schema"] == "envace.audit/1"
    _check_agreement(s, record)
