"""audit.workers: a pool's workers read their own lines (issue 44), and the audit they give is
the one-process audit, line for line: duplicates (within a file, across files), blank,
unreadable, non-UTF-8, over-long and truncated lines, a missing file, and shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.core.schema import TrajectoryWriter


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    d = tmp_path_factory.mktemp("mixed")
    good = d / "good.jsonl"
    with TrajectoryWriter(good, mode="w") as w:
        for t in export_real(split_tasks("dev")[:14]):
            t.messages[2].rehearsed = True
            w.write(t)
    lines = good.read_bytes().splitlines(keepends=True)
    a = d / "a.jsonl"
    a.write_bytes(b"".join([*lines[:4], b"\n", b"   \n", b"{not json\n", lines[1],
                            b"\xff\xfe bad bytes\n", b'{"schema": "other"}\n', *lines[4:9],
                            lines[2][:-40] + b"\n", lines[3]]))
    b = d / "b.jsonl"
    b.write_bytes(b"".join([lines[0], *lines[9:], lines[5][: len(lines[5]) // 2]]))
    return [str(a), str(d / "missing.jsonl"), str(b)]


def _audit(inputs: list[str], out: Path, **kw) -> tuple[dict, str, str]:
    s = run_audit(inputs, out, AuditOptions(progress=False, plots=False, **kw))
    s.pop("seconds")
    return s, (out / "steps.jsonl").read_text(), (out / "trajectories.jsonl").read_text()


@pytest.mark.parametrize("shard", [None, (0, 2), (1, 2)])
def test_two_workers_give_the_one_process_audit(inputs, tmp_path, shard):
    if shard is not None:  # a shard's inputs must all be readable (audit.shard)
        inputs = [p for p in inputs if Path(p).exists()]
    one = _audit(inputs, tmp_path / "w1", shard=shard)
    two = _audit(inputs, tmp_path / "w2", shard=shard, workers=2)
    assert two == one
    s = one[0]
    if shard is None:  # the mix is what it claims: each kind of bad line is there
        reasons = " | ".join(r["reason"] for r in s["skipped_records"])
        for kind in ("duplicate trajectory id", "invalid JSON", "not UTF-8", "schema is",
                     "file not found", "truncated last line"):
            assert kind in reasons, kind
        assert s["counts"]["trajectories"] == 14 and s["reconciles"]


def _traj(tid: str, env: dict) -> str:
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c0", "type": "function",
                     "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
                {"role": "tool", "tool_call_id": "c0", "name": "add", "content": "{}",
                 "rehearsed": True}]
    return json.dumps({"schema": "envace.trajectory/1", "id": tid, "task_id": tid, "env": env,
                       "source": "rehearsed", "messages": messages})


MATH = {"name": "bfcl", "state": {"involved_classes": ["MathAPI"]}}


def test_a_file_named_twice_lists_its_skipped_lines_in_input_order(tmp_path):
    """The review of issue 44: rows of the two readings of one file tied on (file, line) and
    kept the order they were found in, which the read-ahead and the workers made differ."""
    src = tmp_path / "in.jsonl"
    src.write_text(_traj("r1", {"name": "no-such-env", "task": "t"}) + "\n"
                   + _traj("g1", MATH) + "\n")
    one = _audit([str(src), str(src)], tmp_path / "w1")
    two = _audit([str(src), str(src)], tmp_path / "w2", workers=2)
    assert two == one
    reasons = [r["reason"][:20] for r in one[0]["skipped_records"]]
    assert reasons == ["cannot replay: unkno", "duplicate trajectory", "duplicate trajectory"]


def test_workers_do_not_replay_duplicates(tmp_path, monkeypatch):
    """Neither one process nor the workers replay a record whose id came before (the workers
    read the lines, so they presume it from a repeated line or an id they read before)."""
    import audit.workers as W

    log = tmp_path / "replayed.txt"
    real = W.replay_trajectory

    def logged(traj, *a, **k):  # workers fork: the patch reaches them; each logs to the file
        with open(log, "a") as fh:
            fh.write(traj.id + "\n")
        return real(traj, *a, **k)

    monkeypatch.setattr(W, "replay_trajectory", logged)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(_traj(t, MATH) + "\n" for t in ["a", "b", "a", "a", "c", "b"]))
    outs = []
    for w in (1, 2):
        log.write_text("")
        outs.append(_audit([str(src), str(src)], tmp_path / f"w{w}", workers=w))
        assert sorted(log.read_text().split()) == ["a", "b", "c"], w
    assert outs[0] == outs[1]


def test_a_presumed_duplicate_that_is_first_after_all_is_audited(inputs, tmp_path, monkeypatch):
    """Every line hashing alike (as a collision would): the workers presume every record after
    the first a duplicate; the parent finds each first with its id and has it audited alone."""
    import audit.pipeline as P

    one = _audit(inputs, tmp_path / "w1")
    monkeypatch.setattr(P, "hash", lambda raw: 0, raising=False)
    assert _audit(inputs, tmp_path / "w2", workers=2) == one


_STUCK = """
import os, struct, sys, time
from audit.scoring.settings import AuditOptions
from audit.workers import Pool

pool = Pool(AuditOptions(workers=2), None)
pool.ex.submit(int, 1).result()  # the workers are up
# what a worker killed while it wrote a result leaves: the head of a message, not its body
os.write(pool.ex._result_queue._writer.fileno(), struct.pack("!i", 1 << 20) + b"x" * 10)
time.sleep(0.5)  # the executor's manager thread now waits in recv for the rest
pool.close(cancel=True)
print("closed", flush=True)
"""


def test_a_cancelled_pool_lets_the_process_exit_when_a_result_was_cut_off(tmp_path):
    """Ctrl-C with --workers 2 once hung at exit (CI, issue 44): the workers were killed while
    one wrote its result, and the executor's manager thread, which the interpreter joins at exit,
    waited for the rest of that message through a pipe this process still held open."""
    import subprocess
    import sys

    script = tmp_path / "stuck.py"
    script.write_text(_STUCK)
    p = subprocess.Popen([sys.executable, str(script)], cwd=Path(__file__).parents[2],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("the process hung at exit after its pool was cancelled")
    assert p.returncode == 0 and out.strip() == "closed", err
