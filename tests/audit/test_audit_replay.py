"""The audit end to end: known answers, bad input, rescoring, comparing, CLI exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from envace.core.envs.bfcl.tasks import load_tasks, split_tasks
from envace.core.export import export_real
from envace.core.schema import TrajectoryWriter, load_trajectories

AUDIT = [sys.executable, "-m", "audit.cli", "--quiet"]


def _steps(d: Path) -> list[dict]:
    return [json.loads(line) for line in (d / "steps.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def all_real(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("real") / "all.jsonl"
    with TrajectoryWriter(p, mode="w") as w:
        for t in export_real(load_tasks().values()):
            w.write(t)
    return p


def test_real_trajectories_of_all_800_tasks_never_diverge(all_real, tmp_path):
    s = run_audit([str(all_real)], tmp_path, AuditOptions(progress=False, plots=False))
    assert s["counts"]["trajectories"] == 800 and s["counts"]["skipped"] == 0
    assert s["counts"]["steps"] > 4000
    assert s["counts"]["diverged"] == 0 and s["divergence_rate"] == 0
    assert s["by_source"]["real"]["diverged"] == 0
    assert all(v["mean"] == 1.0 for v in s["scores"].values())


def test_altered_responses_diverge_exactly_where_altered(tmp_path):
    trajs = list(export_real(split_tasks("dev")[:12]))
    altered: set[tuple[str, int]] = set()
    for k, t in enumerate(trajs):
        steps = t.tool_steps()
        for st in steps[k % 3:: 3]:  # every third call, staggered
            msg = st.response
            msg.content = json.dumps({"rehearsed": f"wrong {st.step}"})
            msg.rehearsed = True
            altered.add((t.id, st.step))
    p = tmp_path / "altered.jsonl"
    with TrajectoryWriter(p, mode="w") as w:
        for t in trajs:
            w.write(t)
    s = run_audit([str(p)], tmp_path / "a", AuditOptions(progress=False, plots=False))
    got = {(r["trajectory_id"], r["step"]) for r in _steps(tmp_path / "a") if r["diverged"]}
    assert got == altered
    assert s["counts"]["diverged"] == len(altered)
    assert s["by_source"]["real"]["diverged"] == 0
    assert s["by_source"]["rehearsed"]["diverged"] == len(altered)


def test_spec_examples_give_the_counts_the_spec_implies(examples, tmp_path):
    files = [str(examples / f) for f in ("real.jsonl", "rehearsed.jsonl", "edge.jsonl")]
    s = run_audit(files, tmp_path, AuditOptions(progress=False, plots=False))
    c = s["counts"]
    assert c["records_read"] == 9 and c["trajectories"] == 8 and c["skipped"] == 1
    assert s["skipped_records"][0]["line"] == 6 and "truncated" in s["skipped_records"][0]["reason"]
    assert s["reconciles"]
    assert c["malformed_calls"] == 1
    steps = _steps(tmp_path)
    by = {(r["trajectory_id"], r["step"]): r for r in steps}
    # real examples replay without divergence
    assert not any(r["diverged"] for r in steps if r["source_rehearsed"] is False)
    # the rehearsed example predicted a failure where reality succeeded
    rm = by[("reh-example-1", 1)]
    assert rm["diverged"] and rm["rehearsed_error"] and not rm["actual_error"]
    assert rm["scores"]["error_agreement"] == 0.0
    # a malformed call is answered as an invalid call (an error) and diverges
    mal = by[("edge-malformed-arguments", 0)]
    assert mal["malformed"] and mal["actual_error"] and mal["diverged"]
    # an unknown tool is executed as an error and named in a warning
    assert by[("edge-unknown-tool", 0)]["actual_error"]
    assert any("rm_rf_everything" in w["message"] for w in s["warnings"])
    # inline state: MathAPI add(2, 3)
    assert by[("edge-inline-state", 0)]["actual"] == '{"result": 5}'
    assert not by[("edge-inline-state", 0)]["diverged"]


def test_bad_input_is_reported_and_counts_reconcile(tmp_path, examples):
    good = (examples / "real.jsonl").read_text().splitlines()[0]
    rec = json.loads(good)
    big = json.loads(good)
    big["id"] = "big"
    big["messages"][2]["content"] = "x" * 3_000_000  # past the 1 MiB limit of a response
    big["messages"][2]["rehearsed"] = True
    unknown = dict(rec, id="unknown-task", task_id="nope", env={"name": "bfcl", "task": "nope"})
    other_env = dict(rec, id="other-env", env={"name": "no_such_env_zz", "task": "x"})
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b"\n".join([
        good.encode(), b"{oops", b"\xff\xfe", json.dumps(big).encode(),
        json.dumps(unknown).encode(), json.dumps(other_env).encode(), good[:50].encode()]))
    s = run_audit([str(p), str(tmp_path / "missing.jsonl")], tmp_path / "out",
                  AuditOptions(progress=False, plots=False))
    c = s["counts"]
    assert c["records_read"] == 7
    assert c["trajectories"] == 1  # the good one (the big one: docs/audit.md, size limits)
    reasons = {r["line"]: r["reason"] for r in s["skipped_records"]}
    assert set(reasons) == {2, 3, 4, 5, 6, 7, None}
    assert "1048576-byte limit" in reasons[4]
    assert "invalid JSON" in reasons[2] and "UTF-8" in reasons[3]
    assert "unknown task id 'nope'" in reasons[5] and "unknown environment" in reasons[6]
    assert "truncated" in reasons[7] and "not found" in reasons[None]
    assert s["reconciles"]
    assert not any(r["trajectory_id"] == "big" for r in _steps(tmp_path / "out"))


def test_crafted_trajectory_executes_nothing(tmp_path, examples):
    rec = json.loads((examples / "real.jsonl").read_text().splitlines()[0])
    evil = "__import__('os').system('touch /tmp/envace_audit_pwned')"
    rec["messages"][1]["tool_calls"][0]["function"] = {"name": evil, "arguments": {evil: evil}}
    rec["messages"][3]["tool_calls"][0]["function"]["arguments"] = json.dumps({"file_name": evil})
    p = tmp_path / "evil.jsonl"
    p.write_text(json.dumps(rec) + "\n")
    s = run_audit([str(p)], tmp_path / "o", AuditOptions(progress=False, plots=False))
    assert s["counts"]["trajectories"] == 1
    assert not os.path.exists("/tmp/envace_audit_pwned")
    first = _steps(tmp_path / "o")[0]
    assert first["actual_error"] and "unknown tool" in first["actual"]


def test_workers_give_the_same_audit(tmp_path):
    p = tmp_path / "dev.jsonl"
    with TrajectoryWriter(p, mode="w") as w:
        for t in export_real(split_tasks("dev")[:20]):
            t.messages[2].content = "{}"
            t.messages[2].rehearsed = True
            w.write(t)
    run_audit([str(p)], tmp_path / "w1", AuditOptions(progress=False, plots=False))
    run_audit([str(p)], tmp_path / "w2", AuditOptions(progress=False, plots=False, workers=2))
    assert _steps(tmp_path / "w1") == _steps(tmp_path / "w2")


@pytest.fixture(scope="module")
def train_and_dev(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tv")
    for split in ("train", "dev"):
        with TrajectoryWriter(d / f"{split}.jsonl", mode="w") as w:
            for t in export_real(split_tasks(split, ("base",))):
                w.write(t)
    return d / "train.jsonl", d / "dev.jsonl"


def test_cli_baseline_rescore_compare_and_skill(train_and_dev, tmp_path):
    train, dev = train_and_dev
    run = lambda *a: subprocess.run([*AUDIT, *map(str, a)], capture_output=True, text=True)  # noqa: E731
    r = run("baseline", dev, "--reference", train, "--model", "lookup", "--out", tmp_path / "lk")
    assert r.returncode == 0, r.stderr
    lk = json.loads((tmp_path / "lk" / "summary.json").read_text())
    assert 0.2 < lk["divergence_rate"] < 0.8  # a lookup table rehearses part of dev exactly
    assert (tmp_path / "lk" / "report.md").read_text().count("png") >= 2
    r = run("baseline", dev, "--reference", train, "--model", "majority", "--out", tmp_path / "mj")
    assert r.returncode == 0
    # rescore with a lenient verdict: fewer divergences, no replay needed
    r = run("rescore", tmp_path / "lk", "--scorers", "exact", "json_f1", "--verdict", "json_f1",
            "--threshold", "0.5", "--out", tmp_path / "lk2")
    assert r.returncode == 0, r.stderr
    lk2 = json.loads((tmp_path / "lk2" / "summary.json").read_text())
    assert lk2["counts"]["diverged"] < lk["counts"]["diverged"]
    assert lk2["counts"]["steps"] == lk["counts"]["steps"]
    # compare: paired on identical calls, lookup beats majority significantly
    r = run("compare", tmp_path / "mj", tmp_path / "lk", "--out", tmp_path / "cmp")
    assert r.returncode == 0, r.stderr
    cmp = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert cmp["paired"]["pairs"] == lk["counts"]["steps"]
    assert cmp["divergence_rate"]["diff"] < 0 and cmp["paired"]["significant"]
    # replay with references: real data has full skill against every reference
    r = run("baseline", dev, "--reference", train, "--model", "edit", "--out", tmp_path / "ed")
    assert r.returncode == 0, r.stderr
    ed = json.loads((tmp_path / "ed" / "summary.json").read_text())
    # copying the call's arguments into the nearest response beats the lookup on BFCL dev
    assert ed["divergence_rate"] < lk["divergence_rate"]
    r = run("replay", dev, "--reference", train, "--out", tmp_path / "real")
    assert r.returncode == 0
    sk = json.loads((tmp_path / "real" / "summary.json").read_text())["skill"]["by_scorer"]
    assert sk["exact"]["point"] == 1.0 and sk["exact"]["best_reference"] == "edit"
    assert sk["exact"]["f_ref"] == pytest.approx(1 - ed["divergence_rate"])
    against = sk["exact"]["against"]
    assert against["lookup"]["f_ref"] == pytest.approx(1 - lk["divergence_rate"])
    assert all(v["point"] == 1.0 for v in against.values() if v["f_ref"] < 1)
    assert all(v["n_boot_used"] == against["edit"]["n_boot_used"] > 0 for v in against.values()
               if v["f_ref"] < 1)


def test_cli_exit_codes(tmp_path, examples):
    run = lambda *a: subprocess.run([*AUDIT, *map(str, a)], capture_output=True, text=True)  # noqa: E731
    assert run("replay", examples / "real.jsonl", "--out", tmp_path / "a").returncode == 0
    r = run("replay", examples / "edge.jsonl", "--out", tmp_path / "b")
    assert r.returncode == 3 and "edge.jsonl:6" in r.stderr
    r = run("replay", tmp_path / "none.jsonl", "--out", tmp_path / "c")
    assert r.returncode == 2 and "no such file" in r.stderr
    r = run("replay", examples / "real.jsonl", "--scorers", "bogus", "--out", tmp_path / "d")
    assert r.returncode == 2 and "unknown scorer" in r.stderr
    assert run("rescore", tmp_path / "nothing").returncode == 2


def test_streaming_keeps_trajectories_out_of_memory(tmp_path):
    """The reader yields one record at a time: a 2,000-record file is never held whole."""
    import tracemalloc

    p = tmp_path / "many.jsonl"
    trajs = list(export_real(split_tasks("dev")[:10]))
    with TrajectoryWriter(p, mode="w") as w:
        for i in range(200):
            for t in trajs:
                w.write(t.model_copy(update={"id": f"{t.id}-{i}"}))
    assert len(load_trajectories(p)) == 2000
    from envace.core.schema import read_trajectories

    tracemalloc.start()
    for _ in read_trajectories(p):
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < p.stat().st_size / 20
