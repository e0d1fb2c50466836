"""Tests for the teacher-forced probe (audit.probe) and its model side
(envace.evaluation.model_probe, run by `envace probe`)."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest

from audit.pipeline import reference_triples, run_audit
from audit.probe import probe_batched, probe_trajectory, run_probe
from audit.scoring.settings import AuditOptions
from audit.worlds.reference import build_reference
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.core.worldmodel import from_lookup

QUIET = {"progress": False, "plots": False}


@pytest.fixture(scope="module")
def files(small_real_files):
    return small_real_files  # conftest: the first 40 train and 4 dev tasks, real


def _rehearsed_copy(traj):
    """The trajectory with every tool response replaced by a wrong rehearsal."""
    data = traj.dump()
    for m in data["messages"]:
        if m["role"] == "tool":
            m.update(content="WRONG", rehearsed=True)
    return type(traj).model_validate(data)


@pytest.fixture
def quick_summary(monkeypatch):
    """Fewer bootstrap resamples in the summaries (the same for both audits compared)."""
    import audit.stats.summary

    monkeypatch.setattr(audit.stats.summary, "N_BOOT", 50)
    monkeypatch.setattr(audit.stats.summary, "LOGISTIC_BOOT", 5)


def test_lookup_probe_equals_baseline_audit(files, tmp_path, quick_summary):
    ref = build_reference("lookup", reference_triples(files["train"]))
    probe = run_probe([str(files["dev"])], tmp_path / "p", from_lookup(ref),
                      AuditOptions(**QUIET))
    base = run_audit([str(files["dev"])], tmp_path / "b",
                     AuditOptions(reference=str(files["train"]), override="lookup", **QUIET))
    assert probe["counts"]["steps"] == base["counts"]["steps"] > 0
    assert probe["divergence_rate"] == base["divergence_rate"]
    for s in ("exact", "json_f1", "fuzzy"):
        assert probe["scores"][s]["mean"] == pytest.approx(base["scores"][s]["mean"])
    rows = [json.loads(x) for x in (tmp_path / "p" / "steps.jsonl").read_text().splitlines()]
    brows = [json.loads(x) for x in (tmp_path / "b" / "steps.jsonl").read_text().splitlines()]
    keys = set(brows[0])
    assert keys <= set(rows[0]) and all(r["source_rehearsed"] is True for r in rows)
    assert [r["scores"] for r in rows] == [r["scores"] for r in brows]
    for name in ("summary.json", "trajectories.jsonl", "report.md"):
        assert (tmp_path / "p" / name).is_file()


def test_history_holds_real_responses(files):
    from envace.core.schema import read_trajectories

    traj = next(i.trajectory for i in read_trajectories(files["dev"]))
    wrong = _rehearsed_copy(traj)
    seen = []

    def spy(messages, tools, tool, arguments):
        seen.append((messages, tool, arguments))
        return "{}"

    res = probe_trajectory(wrong, spy, AuditOptions(), {})
    steps = traj.tool_steps()
    assert len(seen) == len(res.steps) == len(steps)
    for k, (messages, tool, arguments) in enumerate(seen):
        assert (tool, arguments) == (steps[k].tool, steps[k].arguments)
        last = messages[-1]
        assert last["role"] == "assistant" and last["tool_calls"][0]["function"]["name"] == tool
        tools_seen = [m for m in messages if m["role"] == "tool"]
        assert len(tools_seen) == k
        real = [s.response.content for s in steps[:k]]
        assert [m["content"] for m in tools_seen] == real
        assert all(m["rehearsed"] is False for m in tools_seen)
    # the recorded rehearsals are ignored: the probe scores the rehearser's answers
    assert all(r["rehearsed"] == "{}" for r in res.steps)
    # a subset of steps: all calls still executed, only the chosen ones asked
    seen.clear()
    part = probe_trajectory(wrong, spy, AuditOptions(), {}, steps=[1])
    assert [r["step"] for r in part.steps] == [1] and len(seen) == 1
    assert part.steps[0]["actual"] == res.steps[1]["actual"]


def test_probe_skips_bad_records(files, tmp_path, quick_summary):
    bad = tmp_path / "bad.jsonl"
    lines = files["dev"].read_text().splitlines()[:2]
    bad.write_text(lines[0] + "\n{not json\n" + lines[1] + "\n")
    s = run_probe([str(bad)], tmp_path / "o", lambda *a: "{}", AuditOptions(**QUIET))
    assert s["counts"]["trajectories"] == 2 and s["counts"]["skipped"] == 1
    assert s["reconciles"] and s["skipped_records"][0]["line"] == 2


def test_audit_probe_does_not_import_torch():
    code = ("import sys, audit.probe; "
            "sys.exit(1 if 'torch' in sys.modules or 'transformers' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_same_call():
    from envace.evaluation.model_probe import same_call

    assert same_call("cd", {"folder": "a"}, "cd", {"folder": "a"})
    assert same_call("f", {"x": 5.0, "y": [1, 2]}, "f", {"y": (1, 2), "x": 5})
    assert not same_call("f", {"x": 5}, "f", {"x": "5"})
    assert not same_call("ls", {}, "cd", {})


def test_probe_cli_end_to_end(files, tmp_path):
    from envace.evaluation.model_probe import act_probe, act_requests
    from envace.model.models import build_tiny
    from envace.training.sft import training_texts

    trajs = list(export_real(split_tasks("train")[:4]))
    model_dir = build_tiny(training_texts(trajs), tmp_path / "tiny")
    out = tmp_path / "probe"
    r = subprocess.run([sys.executable, "-m", "envace.cli", "probe", "--model",
                        str(model_dir), str(files["dev"]), "--out", str(out), "--limit", "2",
                        "--max-new-tokens", "6"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["trajectories"] == 2 and summary["probe"] == "teacher_forced"
    rows = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert len(rows) == summary["counts"]["steps"] > 0
    assert all(isinstance(x["rehearsed"], str) for x in rows)
    bad = subprocess.run([sys.executable, "-m", "envace.cli", "probe", "--model", str(model_dir),
                          str(tmp_path / "missing.jsonl"), "--out", str(out)],
                         capture_output=True, text=True)
    assert bad.returncode == 2
    # the old home answers with one line saying where the probe went, and writes nothing
    moved = subprocess.run([sys.executable, "-m", "audit.cli", "--quiet", "probe", "--model",
                            str(model_dir), str(files["dev"]), "--out", str(tmp_path / "old")],
                           capture_output=True, text=True)
    assert moved.returncode == 2 and not (tmp_path / "old").exists()
    assert moved.stderr.strip().count("\n") == 0 and "`envace probe`" in moved.stderr
    # the act probe on the same (untrained) model: one row per chosen step, fields present
    from envace.model.models import load_model

    model, tok = load_model(model_dir)
    dev = list(export_real(split_tasks("dev")[:1]))
    reqs = act_requests(dev, {dev[0].id: [0, 1]})
    rows = act_probe(model, tok, reqs, context=1024, max_new_tokens=4, batch_size=2)
    assert [(x["step"], x["exact_call"]) for x in rows] == [(0, False), (1, False)]


def test_the_batched_probe_holds_one_environment_process_at_a_time(tmp_path):
    """Each trajectory of a batched round had a guarded environment process of its own alive
    until its last answer (up to 64 at once, ~300 MB each): the probe now runs a trajectory's
    recorded calls first and ends the process before asking. The rows are the same as asking
    trajectory by trajectory. The world model here is a fixed answer (a stand-in: the test is
    about the probe's processes, not a model)."""
    trajs = list(export_real(split_tasks("dev")[:6]))
    settings = AuditOptions(progress=False, plots=False)
    alive: list[int] = []

    def answer_batch(requests):  # a stand-in world model: counts live children each round
        alive.append(len(psutil.Process().children(recursive=True)))
        return ['{"ok": true}'] * len(requests)

    batched = probe_batched(trajs, answer_batch, settings)
    assert alive and max(alive) <= 1, alive
    one = [probe_trajectory(t, lambda *a: '{"ok": true}', settings, {}) for t in trajs]
    for b, o in zip(batched, one, strict=True):
        strip = [{k: v for k, v in r.items() if k != "seconds"} for r in b.steps]
        assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in o.steps]


def test_the_streamed_probe_feeds_trajectories_as_others_end_and_writes_in_input_order(
        files, tmp_path, quick_summary):
    """`audit.probe_stream`: with a streaming answerer, every history's trajectories share one
    stream, never more than `chunk` conversations at once, each record starting as soon as
    one ends (no chunk waits for its slowest trajectory); the records are written in input
    order, an unreadable line where it stands, and the rows are the rows of the probe asked
    in rounds. The answerer is a stand-in (a fixed answer per request, given back in an order
    unlike the order asked, as a batched model's would be): the test is about the feed."""
    lines = files["dev"].read_text().splitlines()
    alien = json.loads(lines[0])  # a record of an environment there is not: cannot replay
    alien["id"], alien["env"]["name"] = "alien", "no-such-env"
    src = tmp_path / "dev.jsonl"
    src.write_text("\n".join([lines[0], "{not json", json.dumps(alien), *lines[1:]]) + "\n")

    def reply(request) -> str:  # deterministic in the request, as a greedy model is
        return json.dumps({"n": len(request[0]), "tool": request[2]})

    peak, starts = [0], []

    def stream(first, answered, more):
        queue = list(first)
        starts.append(len(first))
        live = {k for k, _r in first}
        while queue:
            key, request = queue.pop()  # last asked, first answered
            nxt = answered(key, reply(request))
            if nxt is not None:
                queue.insert(0, (key, nxt))
                continue
            live.discard(key)
            new = more()
            live |= {k for k, _r in new}
            queue[:0] = new
            peak[0] = max(peak[0], len(live))
        assert not live

    def rounds(requests):
        return [reply(r) for r in requests]

    stream_answer = type("S", (), {"__call__": lambda self, rs: rounds(rs),
                                   "stream": staticmethod(stream)})()
    opts = AuditOptions(**QUIET)
    both = ("real", "own")
    a = run_probe([str(src)], tmp_path / "stream", None, opts, histories=both,
                  answer_batch=stream_answer, chunk=3)
    b = run_probe([str(src)], tmp_path / "rounds", None, opts, histories=both,
                  answer_batch=rounds, chunk=3)
    assert starts == [2] and peak[0] <= 3  # one trajectory's two histories, then as room frees

    def rows(d):
        out = [json.loads(x) for x in (d / "steps.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "seconds"} for r in out]

    assert len(rows(tmp_path / "stream")) > 10
    assert rows(tmp_path / "stream") == rows(tmp_path / "rounds")
    ids = [json.loads(x)["trajectory_id"]
           for x in (tmp_path / "stream" / "trajectories.jsonl").read_text().splitlines()]
    assert ids == [json.loads(x)["id"] for x in lines]
    assert a["counts"] == b["counts"] and a["counts"]["skipped"] == 2
    assert [r["line"] for r in a["skipped_records"]] == [2, 3]
    assert "cannot replay" in a["skipped_records"][1]["reason"]
