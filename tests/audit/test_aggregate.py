"""The audit's summary from running aggregates (audit.stats.aggregate, flat memory) is
`build_summary` over the list of all rows (the code it replaces in the pipeline), figure for
figure and in the same key order (the per-call blocks, state change and confidence, too): on
rehearsed, real and unmarked responses, partial scores, unanswered and malformed calls, under
every resampling unit; and the replay's fast paths (History's token set, score_fast) give what
the functions they replace give."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.pipeline import run_audit
from audit.replay import MAX_HISTORY_CHARS, History
from audit.scoring.fast import score_fast
from audit.scoring.scorers import ScoreContext, list_scorers, score_step
from audit.scoring.settings import AuditOptions
from audit.stats.aggregate import SummaryAggregator
from audit.stats.steps import novelty
from audit.stats.summary import build_summary, compact
from audit.store.models import summary_data
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.core.schema import TrajectoryWriter


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> str:
    trajs = list(export_real(split_tasks("dev")[:16]))
    for k, t in enumerate(trajs):
        steps = t.tool_steps()
        for s in steps:
            msg = s.response
            msg.rehearsed = False if s.step % 4 == 0 else (None if k % 5 == 0 else True)
            if msg.rehearsed is not False and k % 2 == 0:  # written with its log-probability
                msg.logprob, msg.num_tokens = -0.7 * (s.step + 1) - 0.1 * k, 3
            if msg.rehearsed is not False and (s.step + k) % 3 == 0:
                msg.content = (msg.content or "") + " x" if k % 2 else json.dumps({"r": k})
        if k % 7 == 0 and steps:  # the last call unanswered
            t.messages.remove(steps[-1].response)
        if k % 6 == 1 and steps:
            t.messages[steps[0].message_index].tool_calls[0].function.arguments = "{bad"
    p = tmp_path_factory.mktemp("agg") / "mixed.jsonl"
    with TrajectoryWriter(p, mode="w") as w:
        for t in trajs:
            w.write(t)
    return str(p)


def _old(out, opts) -> str:
    """The summary build_summary makes from the audit's own step rows."""
    s = json.loads((out / "summary.json").read_text())
    rows = [compact(json.loads(x)) for x in (out / "steps.jsonl").read_text().splitlines()]
    old = build_summary(rows, opts, trajectories=s["counts"]["trajectories"],
                        read=s["counts"]["records_read"], skipped=s["skipped_records"],
                        warnings=s["warnings"], inputs=s["inputs"], seconds=s["seconds"])
    return json.dumps(summary_data(old))


@pytest.mark.parametrize("unit", [None, "trajectory", "task", "env_name"])
def test_the_aggregated_summary_is_build_summarys(mixed, tmp_path, unit):
    opts = AuditOptions(progress=False, plots=False, cluster_by=unit,
                        scorers=["exact", "fuzzy", "json_f1", "error_agreement"])
    s = run_audit([mixed], tmp_path / "a", opts)
    assert s["counts"]["unanswered_steps"] and s["counts"]["malformed_calls"]
    assert s["by_source"]["real"]["steps"] and s["by_source"]["unmarked"]["steps"]
    assert s["logistic"]["coefficients"] is not None  # the fit ran on both classes
    assert s["compounding"]["ci"] is not None
    assert s["by_state_change"]["strata"] and s["confidence"] is not None  # per-call blocks
    assert json.dumps(summary_data(s)) == _old(tmp_path / "a", opts)


def test_an_empty_audit_and_a_real_only_one(tmp_path):
    opts = AuditOptions(progress=False, plots=False)
    agg = SummaryAggregator(opts)
    kw = {"trajectories": 0, "read": 0, "skipped": [], "warnings": [], "inputs": ["x"],
          "seconds": 0.0}
    assert agg.summary(**kw) == build_summary([], opts, **kw)
    real = tmp_path / "real.jsonl"
    with TrajectoryWriter(real, mode="w") as w:
        for t in export_real(split_tasks("dev")[:5]):
            w.write(t)
    s = run_audit([str(real)], tmp_path / "r", opts)
    assert s["determinism_check"] is True
    assert json.dumps(summary_data(s)) == _old(tmp_path / "r", opts)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=6), st.text(max_size=60))
def test_history_novelty_is_novelty_of_the_joined_history(parts, actual):
    h = History()
    for p in parts:
        h.add(p)
    joined = "\n".join(parts)[-MAX_HISTORY_CHARS:]
    assert h.text() == joined
    assert h.novelty(actual) == novelty(actual, joined)


def test_history_past_its_limit_reads_its_tail():
    h = History()
    h.add("alpha " * (MAX_HISTORY_CHARS // 6))
    h.add("beta")
    assert h.chars > MAX_HISTORY_CHARS
    assert h.novelty("alpha beta gamma") == novelty("alpha beta gamma", h.text())


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(['{"a": 1}', '{"a": 1.0}', '{"a": [1, "x"]}', "None", "", "text",
                        '{"error": "no"}', "Error during execution: x", '{"a": NaN}']),
       st.sampled_from(['{"a": 1}', '{"a": 2}', "text", "", '{"error": "no"}']),
       st.booleans(), st.sampled_from([None, True, False]))
def test_score_fast_is_score_step(a, b, same, flag):
    rehearsed = b if same else a
    ctx = ScoreContext(tool="t", mutates_state=flag, actual_error=flag, rehearsed_error=flag)
    names = list_scorers()
    assert score_fast(rehearsed, b, ctx, names) == score_step(rehearsed, b, ctx, names)
