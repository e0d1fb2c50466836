"""by_state_change (audit.stats.state_change): fidelity by how many state leaves a call changed,
the cliff verdict, the claims of write calls, and the field replay writes."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from audit.stats.intervals import IntervalSpec
from audit.stats.state_change import by_state_change, cliff_line, stratum
from audit.store.step_rows import StepRow
from envace.core.envs.family import family
from envace.core.export import export_real
from envace.core.schema import TrajectoryWriter

SPEC = IntervalSpec(resamples=200, seed=0)


def _row(t, leaves, diverged, write=True, claimed_err=False, real_err=False, ref=0.0):
    return {"trajectory_id": f"t{t}", "step": 0, "tool": "x", "diverged": diverged,
            "scores": {"exact": 0.0 if diverged else 1.0}, "mutates_state": write,
            "rehearsed_error": claimed_err, "actual_error": real_err,
            "ref_scores": {"lookup": {"exact": ref}},
            **({} if leaves is None else {"state_leaves": leaves})}


def test_a_cliff_is_found_where_several_changed_leaves_diverge():
    rows = []
    for t in range(30):  # each trajectory: two calls that change nothing (right), two that
        rows += [_row(t, 0, False, write=False), _row(t, 0, False, write=False),  # change 3+
                 _row(t, 3, True), _row(t, 5, t % 10 != 0)]
    block = by_state_change(rows, ["exact"], SPEC, {"exact": "lookup"})
    assert set(block["strata"]) == {"0", "3+"}
    assert block["strata"]["0"]["divergence_rate"] == 0.0
    assert block["strata"]["3+"]["divergence_rate"] == 57 / 60
    assert block["strata"]["3+"]["divergence_ci"][1] <= 1.0
    assert block["cliff"]["present"] is True and block["cliff"]["ci"][0] > 0
    assert block["strata"]["0"]["skill"]["exact"]["point"] == 1.0  # ref 0, model 1
    assert "yes" in cliff_line(block)


def test_no_cliff_when_fidelity_does_not_depend_on_the_change():
    rows = [_row(t, leaves, t % 3 == 0) for t in range(60) for leaves in (0, 2)]
    block = by_state_change(rows, ["exact"], SPEC)
    assert block["cliff"]["present"] is False
    assert block["cliff"]["diff"] == 0.0
    assert "skill" not in block["strata"]["0"]  # no reference: no skill
    assert cliff_line(block).startswith("State-change cliff: no")


def test_an_audit_without_the_field_has_no_block_and_unknowns_are_their_own_stratum():
    assert by_state_change([_row(1, None, False)], ["exact"], SPEC) is None
    block = by_state_change([_row(1, None, False), _row(2, 1, True)], ["exact"], SPEC)
    assert list(block["strata"]) == ["1", "unknown"]
    assert block["cliff"]["present"] is None and "not assessable" in cliff_line(block)


def test_claims_of_write_calls_are_counted_apart_from_reads():
    rows = [_row(1, 1, True, write=True, claimed_err=False, real_err=True),   # hides a failure
            _row(2, 0, True, write=True, claimed_err=True, real_err=False),   # invents one
            _row(3, 1, False, write=True),
            _row(4, 0, True, write=False, claimed_err=False, real_err=True)]
    c = by_state_change(rows, ["exact"], SPEC)["claims"]
    assert c["write"] == {"calls": 3, "real_errors": 1, "claims_success_real_error": 1,
                          "claims_error_real_success": 1, "claims_success_real_error_rate": 1.0,
                          "claims_error_real_success_rate": 0.5}
    assert c["read"]["claims_success_real_error"] == 1 and c["read"]["calls"] == 1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.one_of(st.none(), st.integers(0, 9)),
                          st.booleans()), min_size=1, max_size=40))
def test_strata_partition_the_rows(items):
    rows = [_row(t, leaves, d) for t, leaves, d in items]
    block = by_state_change(rows, ["exact"], SPEC)
    if block is None:
        assert all(leaves is None for _, leaves, _ in items)
        return
    assert sum(s["n"] for s in block["strata"].values()) == len(rows)
    assert sum(s["diverged"] for s in block["strata"].values()) == sum(d for *_, d in items)
    for label, s in block["strata"].items():
        assert s["n"] == sum(stratum(r) == label for r in rows)


def test_replay_records_the_state_change_of_every_call(tmp_path):
    fam = family("bfcl")
    tasks = fam.split_tasks("dev", "task")[:3]
    path = tmp_path / "dev.jsonl"
    with TrajectoryWriter(path, mode="w") as w:
        for t in export_real(tasks):
            w.write(t)
    s = run_audit([str(path)], tmp_path / "out", AuditOptions(
        scorers=["exact", "state_change"], progress=False, plots=False))
    rows = [json.loads(x) for x in (tmp_path / "out" / "steps.jsonl").read_text().splitlines()]
    assert rows and all(isinstance(r["state_change"]["leaves"], int) for r in rows)
    for r in rows:
        StepRow.model_validate(r)
        assert len(r["state_change"]["paths"]) == min(r["state_change"]["leaves"], 20)
    assert any(r["state_change"]["leaves"] > 0 for r in rows if r["mutates_state"])
    assert all(r["state_change"]["leaves"] == 0 for r in rows if r["mutates_state"] is False)
    for r in rows:  # the state_change scorer observes the real change (claims = not an error)
        if r["mutates_state"]:
            agree = (not r["actual_error"]) == (r["state_change"]["leaves"] > 0)
            assert r["scores"]["state_change"] == float(agree), r
    block = s["by_state_change"]
    assert sum(v["n"] for v in block["strata"].values()) == s["counts"]["scored_steps"]
    assert "State-change cliff" in (tmp_path / "out" / "report.md").read_text()
    from audit.cli import main

    assert main(["--quiet", "replay", str(path), "--out", str(tmp_path / "off"),
                 "--no-state-change"]) == 0
    assert "by_state_change" not in json.loads((tmp_path / "off" / "summary.json").read_text())
    assert "state_change" not in (tmp_path / "off" / "steps.jsonl").read_text()
