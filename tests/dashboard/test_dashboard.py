"""The dashboard's pages through ``streamlit.testing.v1.AppTest``, on fixture runs made by the
project's own commands (``tests/fixtures_dashboard.py``) and on broken inputs.

Assertions are on the figures shown (metrics, tables, chart data) against the files they come
from, not only on the page rendering. ``tiny`` is a real ``envace train`` run (made once per
session); the synthetic ``demo`` is opened only for what a short real run does not have (see the
fixture's docstring).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from streamlit import dataframe_util
from streamlit.testing.v1 import AppTest

from tests.fixtures_dashboard import shared_root

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
PAGES = ["runs", "training", "fidelity", "trajectories", "compare", "rehearsal", "board"]


@pytest.fixture(scope="session")
def root(tmp_path_factory) -> Path:
    return shared_root(tmp_path_factory.getbasetemp())


def open_page(monkeypatch, root: Path, page: str, run: str | None = None,
              **query: str) -> AppTest:
    monkeypatch.setenv("ENVACE_DASHBOARD_ROOT", str(root))
    at = AppTest.from_file(APP, default_timeout=120)
    if run is not None:
        at.query_params["run"] = run
    at.query_params.update(query)
    at.run()
    if page != "runs":
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def shown(markdown_text: object) -> str:
    """What a markdown string reads as: the backslash escapes and word joiners that
    ``dashboard.safe.md`` puts into file content resolved."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", str(markdown_text)).replace("\u2060", "")


def metrics(at: AppTest) -> dict[str, str]:
    return {shown(m.label): m.value for m in at.metric}


def charts(at: AppTest) -> dict[str, list]:
    """Chart title -> the data frames drawn in it."""
    out = {}
    for el in at.get("vega_lite_chart"):
        spec = json.loads(el.proto.spec)
        title = spec.get("title") or next((x.get("title") for x in spec.get("layer", [])), None)
        out[title] = [dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data)
                      for d in el.proto.datasets]
    return out


def texts(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "caption", "info", "warning", "error", "success")
             for e in at.get(kind)]
    return "\n".join(shown(p) for p in parts)


def pct(x: float) -> str:
    return f"{x:.1%}"


def summary(path: Path) -> dict:
    return json.loads((path / "summary.json").read_text())


def audited_steps(run: Path) -> list[int]:
    """The training steps a run's audits cover, in order."""
    return sorted(int(d.name.split("_")[1]) for d in (run / "audit").glob("step_*"))


def metric_rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- pages on fixture runs


def test_runs_page_lists_every_run_with_its_status(monkeypatch, root):
    (root / "live" / "heartbeat").write_text("now")  # a live run beats every 20 s
    at = open_page(monkeypatch, root, "runs", run="tiny")
    table = at.table[0].value
    assert table.loc["tiny", "status"] == "finished" and table.loc["demo", "status"] == "finished"
    assert table.loc["live", "status"] == "running"
    assert table.loc["died", "status"] == "died"
    assert table.loc["empty", "kind"] == "empty"
    assert table.loc["lookup_dev", "kind"] == "audit" and table.loc["real_dev", "kind"] == "audit"
    assert table.loc["eval-dev-parallel-n2", "kind"] == "eval"
    real = root / "tiny"
    latest = summary(real / "audit" / f"step_{audited_steps(real)[-1]}")
    m = metrics(at)
    assert m["Latest divergence rate"] == pct(latest["divergence_rate"])
    assert m["Steps logged"] == str(len(metric_rows(real))) == "3" and m["Status"] == "finished"
    assert table.loc["lookup_dev", "latest divergence"] == pct(
        summary(root / "lookup_dev")["divergence_rate"])
    assert "mode: envace" in at.code[0].value  # config.yaml shown


def test_training_page_plots_every_metric_group_on_one_axis(monkeypatch, root):
    """On the real run: every group of keys the trainer logged has its chart."""
    from dashboard.readers import metric_groups

    run = root / "tiny"
    at = open_page(monkeypatch, root, "training", run="tiny")
    rows = metric_rows(run)
    m = metrics(at)
    assert m["Reward"] == f"{rows[-1]['reward/mean']:.3f}"
    assert m["Divergence rate"] == pct(rows[-1]["fidelity/divergence_rate"])
    shown = charts(at)
    groups = metric_groups(sorted({k for r in rows for k in r}))
    groups.pop("time")
    drawn = [set(frames[0]["metric"]) for frames in shown.values()
             if frames and "metric" in frames[0]]
    for group, keys in groups.items():  # each group the trainer logged, in one chart
        assert any(set(keys) <= d for d in drawn), (group, keys, sorted(shown))
    assert {"reward", "loss", "entropy", "tokens", "fidelity"} <= set(groups)
    reward = shown["Reward (overall and by role)"][0]
    assert set(reward["metric"]) == {"reward/mean", "reward/act", "reward/rehearse"}
    trend = shown["Divergence rate measured by the audits"][0]
    assert audited_steps(run) == [0, 1, 2]
    for step in audited_steps(run):
        s = summary(run / "audit" / f"step_{step}")
        assert trend.set_index("step").loc[step, "divergence_rate"] == pytest.approx(
            s["divergence_rate"])
    # where each step's time went: the time/* sections stacked, the whole left out of the stack
    assert "time" not in shown  # not drawn as lines as well
    stack = shown["Where each step's time went (seconds)"][0]
    sections = {k for k in rows[0] if k.startswith("time/") and k != "time/step"}
    assert set(stack["part"]) == sections and "time/rollout/decode" in sections
    for r in rows:
        drawn = stack[stack["step"] == r["step"]]
        assert dict(zip(drawn["part"], drawn["value"], strict=True)) == pytest.approx(
            {k: r[k] for k in sections})
        assert drawn["value"].sum() == pytest.approx(r["time/step"])


def test_training_page_shows_a_new_metric_key_without_code_changes(monkeypatch, tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 1.0 / (s + 1), "probe/brand_new": s * 2.0,
                    "note": "text is ignored"}) + "\n" for s in range(3)))
    (run / "report.md").write_text("done")
    at = open_page(monkeypatch, tmp_path, "training", run="r")
    shown = charts(at)
    assert "probe" in shown and list(shown["probe"][0]["value"]) == [0.0, 2.0, 4.0]


BPB_TITLE = "Bits per byte of real responses, held-out dev batch (lower: closer to the world)"


def test_training_page_draws_the_held_out_bits_per_byte_curve(monkeypatch, tmp_path):
    """fidelity_bpb (fidelity_nll_every=2, three steps): one line beside the fidelity chart,
    each point after the updates done, the last row's fidelity_bpb_end one update later; the
    counts beside it are not charts of their own."""
    run = tmp_path / "r"
    run.mkdir()
    rows = [{"step": 0, "loss": 1.0, "fidelity/exact": 0.2, "fidelity_bpb": 1.5,
             "fidelity_bpb_tokens": 90, "fidelity_bpb_steps": 7},
            {"step": 1, "loss": 0.9, "fidelity/exact": 0.1},
            {"step": 2, "loss": 0.8, "fidelity/exact": 0.1, "fidelity_bpb": 1.6,
             "fidelity_bpb_tokens": 90, "fidelity_bpb_steps": 7, "fidelity_bpb_end": 1.7,
             "fidelity_bpb_end_tokens": 90, "fidelity_bpb_end_steps": 7}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "report.md").write_text("done")
    at = open_page(monkeypatch, tmp_path, "training", run="r")
    shown = charts(at)
    curve = shown[BPB_TITLE][0]
    assert list(curve["step"]) == [0.0, 2.0, 3.0]
    assert list(curve["value"]) == pytest.approx([1.5, 1.6, 1.7])
    assert set(curve["metric"]) == {"fidelity_bpb"}
    assert not any(t and t.startswith("fidelity_bpb") for t in shown)
    assert "Fidelity (logged by the trainer)" in shown
    # a run without the curve has no such chart
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({k: v for k, v in r.items() if "bpb" not in k}) + "\n" for r in rows))
    at = open_page(monkeypatch, tmp_path, "training", run="r")
    assert BPB_TITLE not in charts(at)


def test_fidelity_page_shows_the_audit_figures(monkeypatch, root):
    s = summary(root / "lookup_dev")
    at = open_page(monkeypatch, root, "fidelity", run="lookup_dev")
    m = metrics(at)
    assert m["Divergence rate"] == pct(s["divergence_rate"])
    assert m["Rehearsed tool calls"] == str(s["counts"]["scored_steps"])
    assert m["Trajectories"] == str(s["counts"]["trajectories"])
    assert m["Compounding ratio"] == f"{s['compounding']['ratio']:.2f}"
    assert m["Median first divergence"] == str(s["median_first_divergence"])
    shown = charts(at)
    depth = shown["Divergence rate by step depth"][0].set_index("depth")
    for row in s["by_depth"]:
        assert depth.loc[row["depth"], "divergence_rate"] == pytest.approx(row["divergence_rate"])
        assert depth.loc[row["depth"], "lo"] == pytest.approx(row["divergence_ci"][0])
    surv = shown["P(no divergence up to depth)"][0]
    assert list(surv["survival"]) == pytest.approx(
        [r["survival"] for r in s["first_divergence"]["rows"]])
    tools = shown["Divergence by tool"][0].set_index("tool")
    for tool, row in s["by_tool"].items():
        assert tools.loc[tool, "divergence_rate"] == pytest.approx(row["divergence_rate"])
    rw = shown["Divergence of read vs write tools"][0].set_index("kind")
    assert set(rw.index) == set(s["by_mutates_state"])
    assert "Divergence by novelty of the true response" in shown
    assert "Divergence given the history" in shown  # the compounding curve


def test_fidelity_page_over_training(monkeypatch, root):
    run = root / "tiny"
    at = open_page(monkeypatch, root, "fidelity", run="tiny")
    trend = charts(at)["Divergence rate per audited training step"][0].set_index("step")
    assert list(trend.index) == audited_steps(run) == [0, 1, 2]
    for step in audited_steps(run):
        s = summary(run / "audit" / f"step_{step}")
        assert trend.loc[step, "divergence_rate"] == pytest.approx(s["divergence_rate"])
        assert trend.loc[step, "lo"] == pytest.approx(s["divergence_ci"][0])


def test_fidelity_page_skill_of_a_training_audit(monkeypatch, root):
    """Synthetic ``demo``: its step audits have a reference (the trainer's have none)."""
    at = open_page(monkeypatch, root, "fidelity", run="demo")
    s10 = summary(root / "demo" / "audit" / "step_10")
    skill = next(d.value for d in at.dataframe if "best reference" in d.value.columns)
    exact = skill.set_index("scorer").loc["exact"]
    assert exact["best reference"] == s10["skill"]["by_scorer"]["exact"]["best_reference"]
    assert exact["skill"] == pytest.approx(s10["skill"]["by_scorer"]["exact"]["point"])
    each = next(d.value for d in at.dataframe if "reference's score" in d.value.columns)
    against = s10["skill"]["by_scorer"]["exact"]["against"]
    rows = each[each["scorer"] == "exact"].set_index("reference")
    assert set(rows.index) == set(against) >= {"lookup", "edit"}
    for ref, v in against.items():
        assert rows.loc[ref, "skill"] == pytest.approx(v["point"], nan_ok=True)


def _steps(path: Path) -> list[dict]:
    return [json.loads(x) for x in (path / "steps.jsonl").read_text().splitlines()]


def test_trajectories_page_conversation_diff_and_first_divergence(monkeypatch, root):
    audit = root / "tiny" / "audit" / "step_0"
    rows = [json.loads(x) for x in (audit / "trajectories.jsonl").read_text().splitlines()]
    row = next(r for r in rows if r["first_divergence"] is not None)
    at = open_page(monkeypatch, root, "trajectories", run="tiny", traj=row["trajectory_id"])
    at.selectbox(key="tr_audit").set_value(
        next(o for o in at.selectbox(key="tr_audit").options if "step_0" in str(o))).run()
    assert at.selectbox(key="tr_traj").value == row["trajectory_id"]
    body = texts(at)
    assert f"First divergence** — step {row['first_divergence']}" in body
    assert f"first divergence at **step {row['first_divergence']}**" in body
    assert at.chat_message, "the conversation (user and assistant turns) is shown"
    diverged = [s for s in _steps(audit) if s["trajectory_id"] == row["trajectory_id"]
                and s["diverged"]]
    html = "\n".join(h.proto.body for h in at.get("html"))
    assert "background:#fde68a" in html or "background:#bbf7d0" in html  # highlighted leaves
    assert len(at.get("html")) == 2 * len(
        [s for s in _steps(audit) if s["trajectory_id"] == row["trajectory_id"]])
    assert body.count("✗ diverged") == len(diverged)


def test_trajectories_page_aligns_a_skipped_and_an_inserted_call(monkeypatch, root):
    # the fixture skips the second call of trajectory 1 and repeats the first of trajectory 2
    dev = [json.loads(x) for x in (root / "inputs" / "dev.jsonl").read_text().splitlines()]
    skipped, inserted = f"s10-{dev[1]['id']}", f"s10-{dev[2]['id']}"
    at = open_page(monkeypatch, root, "trajectories", run="demo", traj=skipped)
    assert "(real)" in at.selectbox(key="tr_ref").value  # the real trajectory by default
    assert "1 skipped" in texts(at) and "0 inserted" in texts(at)
    table = next(d.value for d in at.dataframe if "alignment" in d.value.columns)
    assert list(table["alignment"]).count("skipped") == 1
    skipped_call = table[table["alignment"] == "skipped"]["reference call"].iloc[0]
    assert "skipped: the reference calls here" in texts(at)
    assert any(c.value == skipped_call for c in at.code)
    at.selectbox(key="tr_traj").set_value(inserted).run()
    assert "1 inserted" in texts(at) and "inserted: not in the reference" in texts(at)


def test_trajectories_page_filters(monkeypatch, root):
    steps = _steps(root / "demo" / "audit" / "step_10")
    at = open_page(monkeypatch, root, "trajectories", run="demo")
    tool = next(s["tool"] for s in steps if s["diverged"])
    at.multiselect(key="tr_tools").set_value([tool])
    at.selectbox(key="tr_div").set_value("diverged").run()
    want = [s for s in steps if s["tool"] == tool and s["diverged"]]
    ids = {s["trajectory_id"] for s in want}
    assert f"{len(want)} of {len(steps)} steps match, in {len(ids)} of" in texts(at)
    assert set(at.selectbox(key="tr_traj").options) == ids
    clean = next(s["task_id"] for s in steps
                 if not any(x["diverged"] for x in steps if x["task_id"] == s["task_id"]))
    at.multiselect(key="tr_tools").set_value([])
    at.multiselect(key="tr_tasks").set_value([clean]).run()
    assert "No trajectory matches these filters." in texts(at)
    top = max(s["step"] for s in steps)
    at.selectbox(key="tr_div").set_value("any")
    at.multiselect(key="tr_tasks").set_value([])
    at.slider(key="tr_depth").set_value((top, top)).run()
    deep = {s["trajectory_id"] for s in steps if s["step"] == top}
    assert set(at.selectbox(key="tr_traj").options) == deep


def test_compare_page_two_audits_uses_audit_compare(monkeypatch, root):
    from audit.compare import compare_audits

    at = open_page(monkeypatch, root, "compare", run="demo")
    a, b = at.selectbox(key="cmp_Audit_a").value, at.selectbox(key="cmp_Audit_b").value
    assert (a, b) == ("demo/step_0", "demo/step_10")
    c = compare_audits(root / "demo" / "audit" / "step_0", root / "demo" / "audit" / "step_10")
    m = metrics(at)
    assert m["A · demo/step_0"] == pct(c["divergence_rate"]["a"])
    assert m["B · demo/step_10"] == pct(c["divergence_rate"]["b"])
    table = at.dataframe[0].value.set_index("figure")
    assert table.loc["divergence rate", "p"] == pytest.approx(c["divergence_rate"]["p_value"])
    assert table.loc["divergence rate", "lo"] == pytest.approx(c["divergence_rate"]["ci"][0])
    assert f"Paired on **{c['paired']['pairs']}** identical calls" in texts(at)
    assert "Divergence by depth: A vs B" in charts(at)


def test_compare_page_two_runs(monkeypatch, root):
    at = open_page(monkeypatch, root, "compare", run="demo")
    at.radio(key="cmp_mode").set_value("two training runs").run()
    at.selectbox(key="cmp_Run_a").set_value("tiny")
    at.selectbox(key="cmp_Run_b").set_value("live").run()
    assert not at.exception
    diff = next(d.value for d in at.dataframe if "key" in d.value.columns).set_index("key")
    assert diff.loc["steps", "A"] == "3" and diff.loc["steps", "B"] == "100"
    assert "reward/mean" in charts(at)


@pytest.mark.parametrize("run", ["demo", "eval-dev-parallel-n2"])
def test_rehearsal_page_plans_memory_commit(monkeypatch, root, run):
    at = open_page(monkeypatch, root, "rehearsal", run=run)
    d = root / "demo" / "eval" / "rehearsal_dev"
    ev = json.loads((d / "summary.json").read_text())
    m = metrics(at)
    assert m["Success rate"] == pct(ev["success_rate"])
    assert m["Rehearsal divergence"] == pct(ev["rehearsal_audit"]["divergence_rate"])
    assert m["Strategy (n=2)"] == "parallel"
    recs = [json.loads(x) for x in (d / "trajectories.jsonl").read_text().splitlines()]
    commits = [r for r in recs if r["meta"]["plan"] == "commit"]
    table = at.dataframe[0].value
    assert list(table["plans"]) == [2] * len(commits)  # plans.jsonl repeats are not counted
    assert list(table["outcome"]) == ["success" if c["meta"]["success"] else "failure"
                                      for c in commits]
    plan_audit = _steps(d / "audit")
    p0 = [x for x in plan_audit if x["trajectory_id"] == commits[0]["meta"]["plans"][0]]
    assert table["rehearsal divergence"].iloc[0] != "–"
    assert f"{sum(x['diverged'] for x in p0)} of {len(p0)} rehearsed responses diverge" in (
        texts(at))
    assert any(c.value == commits[0]["meta"]["memory"] for c in at.code)
    assert "Outcome: success" in texts(at)
    at.selectbox(key="rh_task").set_value(at.selectbox(key="rh_task").options[1]).run()
    assert "Outcome: failure" in texts(at)


def test_rehearsal_page_without_evaluations_says_so(monkeypatch, root):
    at = open_page(monkeypatch, root, "rehearsal", run="lookup_dev")
    assert "No rehearsal evaluations in this run" in texts(at)


def test_a_plain_audit_directory_opens_as_the_root(monkeypatch, root):
    s = summary(root / "lookup_dev")
    for page in PAGES:
        at = open_page(monkeypatch, root / "lookup_dev", page)
        if page == "fidelity":
            assert metrics(at)["Divergence rate"] == pct(s["divergence_rate"])
        if page == "training":
            assert "is an audit directory, not a training run" in texts(at)
    # its trajectory file lies outside this root: the calls are shown, the file is not read
    at = open_page(monkeypatch, root / "lookup_dev", "trajectories")
    assert "outside the dashboard root" in texts(at)
    assert len(at.get("html")) > 0


@pytest.mark.parametrize("run", ["tiny", "demo", "live", "died", "empty", "lookup_dev", "real_dev",
                                 "eval-dev-parallel-n2"])
def test_every_page_of_every_fixture_run_renders_without_error(monkeypatch, root, run):
    for page in PAGES:
        at = open_page(monkeypatch, root, page, run=run)
        assert not at.error, (page, [e.value for e in at.error])


# ---------------------------------------------------------------- broken inputs


def test_truncated_metrics_and_no_audit_yet(monkeypatch, root):
    at = open_page(monkeypatch, root, "training", run="live")
    assert "last line is truncated" in texts(at)
    rows = (root / "live" / "metrics.jsonl").read_text().splitlines()[:-1]
    assert metrics(at)["Reward"] == f"{json.loads(rows[-1])['reward/mean']:.3f}"
    for page in ("fidelity", "trajectories"):
        at = open_page(monkeypatch, root, page, run="live")
        assert "No audit yet in `live`" in texts(at)
    (root / "live" / "heartbeat").write_text("now")  # a live run beats every 20 s
    at = open_page(monkeypatch, root, "runs", run="live")
    assert metrics(at)["Status"] == "running"
    assert "Refreshing every" in texts(at)


def test_empty_root_and_missing_root(monkeypatch, tmp_path):
    for page in PAGES:
        at = open_page(monkeypatch, tmp_path, page)
        assert at.info or at.error, page
    assert "No runs found under" in texts(open_page(monkeypatch, tmp_path, "runs"))
    at = open_page(monkeypatch, tmp_path / "nope", "fidelity")
    assert "is not a directory" in texts(at)


def test_empty_run_directory(monkeypatch, root):
    at = open_page(monkeypatch, root, "runs", run="empty")
    assert "holds nothing the dashboard can read yet" in texts(at)


@pytest.mark.parametrize("page", PAGES)
def test_a_path_outside_the_root_is_refused(monkeypatch, root, page):
    at = open_page(monkeypatch, root / "demo", page, run="../lookup_dev")
    assert "Refused" in texts(at) and "outside the dashboard root" in texts(at)
    assert not metrics(at).get("Divergence rate")


def test_a_typed_directory_outside_the_root_is_refused(monkeypatch, root):
    at = open_page(monkeypatch, root / "demo", "fidelity")
    at.text_input(key="open_dir").set_value("/etc").run()
    assert "Refused" in texts(at)
    at.text_input(key="open_dir").set_value("audit/step_5").run()  # inside: opens
    s = summary(root / "demo" / "audit" / "step_5")
    assert metrics(at)["Divergence rate"] == pct(s["divergence_rate"])


def test_corrupt_summary_truncated_steps_and_missing_index(monkeypatch, root, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(root / "lookup_dev", bad)
    (bad / "summary.json").write_text('{"divergence_rate": 0.5, "cou')
    steps = (bad / "steps.jsonl").read_text()
    (bad / "steps.jsonl").write_text(steps + steps.splitlines()[0][:40])
    (bad / "trajectories.jsonl").unlink()
    at = open_page(monkeypatch, tmp_path, "fidelity", run="bad")
    assert "summary.json cannot be read" in texts(at)
    at = open_page(monkeypatch, tmp_path, "trajectories", run="bad")
    body = texts(at)
    assert "steps.jsonl: the last line is truncated" in body
    assert "rebuilt from steps.jsonl" in body
    n = len(steps.splitlines())
    assert f"{n} of {n} steps match" in body


def test_garbage_lines_in_metrics_are_reported_with_line_numbers(monkeypatch, tmp_path):
    run = tmp_path / "g"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "loss": 1}\nnot json\n[1, 2]\n'
                                       '{"step": 1, "loss": 0.5}\n')
    at = open_page(monkeypatch, tmp_path, "training", run="g")
    assert "skipped 2 unreadable line(s): line 2" in texts(at)
    assert metrics(at)["Loss"] == "0.500"


def test_half_written_runs_and_a_symlink_out_of_the_root(monkeypatch, tmp_path, root):
    (tmp_path / "nosummary").mkdir()
    (tmp_path / "nosummary" / "steps.jsonl").write_text("")
    (tmp_path / "nometrics").mkdir()
    (tmp_path / "nometrics" / "metrics.jsonl").write_text("")
    (tmp_path / "noscores").mkdir()
    (tmp_path / "noscores" / "steps.jsonl").write_bytes(
        b'{"trajectory_id": "t", "task_id": "k", "step": 0, "tool": "ls", "diverged": true}\n'
        b'\xff\xfe not utf-8\n')
    (tmp_path / "escape").symlink_to(root / "demo")
    for run, page, says in [("nosummary", "fidelity", "summary.json does not exist yet"),
                            ("nosummary", "trajectories", "no audited steps yet"),
                            ("nometrics", "training", "holds no complete record yet"),
                            ("noscores", "trajectories", "skipped 1 unreadable line(s)")]:
        at = open_page(monkeypatch, tmp_path, page, run=run)
        assert says in texts(at), (run, page, texts(at))
        assert not at.error, [e.value for e in at.error]
    at = open_page(monkeypatch, tmp_path, "runs")
    assert "escape" not in list(at.table[0].value.index)
    assert "Refused" in texts(open_page(monkeypatch, tmp_path, "fidelity", run="escape"))
