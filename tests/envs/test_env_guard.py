"""Issue #39, the centre: every environment call runs under a wall-clock and a memory limit that
holds for C code (``envace.core.envs.guard``), costs at most its own trajectory, and Ctrl-C
during such a call exits 130.

The stalling call is BFCL's own ``square_root(number=2, precision=10**7)``: 127 s inside
``decimal``'s C code, where no signal handler runs. The hostile environments (a tool that kills
its process, one that allocates without bound) are registered in this process; the guard forks,
so its child has them, as audit workers do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import psutil
import pytest

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from envace.core.envs.base import ToolKind, register_env
from envace.core.envs.guard import GuardedEnv, guarded_env
from envace.core.envs.limits import CallLimits, CallTimeout
from tests.envs.hostile_env import HostileEnv  # noqa: F401 - registers test-hostile

ROOT = Path(__file__).resolve().parents[2]
STALL = ("square_root", {"number": 2, "precision": 10**7})


@pytest.fixture(autouse=True)
def _no_plots():
    with mock.patch("audit.store.report.plot_all", return_value=[]):
        yield


def test_a_c_level_stall_is_killed_at_the_limit_and_the_state_kept():
    env = guarded_env("bfcl", CallLimits(call_timeout_s=1.5))
    env.reset({"involved_classes": ["MathAPI", "GorillaFileSystem"]})
    assert not env.execute("mkdir", {"dir_name": "w"}).error
    assert not env.execute("cd", {"folder": "w"}).error
    where = env.execute("pwd", {}).content
    before = env.state_hash()
    t0 = time.monotonic()
    res = env.execute(*STALL)
    took = time.monotonic() - t0
    assert res.error and res.timeout and "call limit of 1.5 s" in res.content
    assert took < 10, took
    assert env.restarts == 1
    # the new process was brought back to the state before the killed call
    assert env.state_hash() == before
    assert env.execute("pwd", {}).content == where and "w" in where
    env.close()


def test_a_process_that_dies_or_stalls_costs_one_call_and_memory_is_limited():
    env = GuardedEnv("test-hostile", {}, CallLimits(call_timeout_s=1.0, memory_mb=256))
    env.reset("t")
    assert env.execute("count", {}).content == '{"n": 1}'
    died = env.execute("die", {})
    # a death is marked as what it is (crashed, with its exit code or signal), not a timeout
    assert died.error and died.crashed and not died.timeout and "exit code 7" in died.content
    assert env.execute("count", {}).content == '{"n": 2}'  # state restored, then the call
    segv = env.execute("segv", {})
    assert segv.crashed and not segv.timeout and "killed by SIGSEGV" in segv.content
    stalled = env.execute("sleep", {"s": 60})
    assert stalled.timeout and not stalled.crashed
    ate = env.execute("eat", {"mb": 8192})  # 8 GiB past a 256 MiB limit: MemoryError in child
    assert ate.error
    assert env.execute("count", {}).content == '{"n": 3}'
    results = list(env.execute_many([("count", {}), ("die", {}), ("count", {})]))
    assert [r.crashed for r in results] == [False, True, False]
    assert results[2].content == '{"n": 5}'
    with pytest.raises(CallTimeout):
        GuardedEnv("test-hostile", {}, CallLimits(call_timeout_s=0.5))._call("execute", "sleep",
                                                                            {"s": 5})
    env.close()


def test_a_plugin_that_exits_on_load_is_a_load_error():
    from envace.core.envs.base import PluginLoadError

    @register_env("test-exits")
    def _factory():
        raise SystemExit(0)

    with pytest.raises(PluginLoadError, match="SystemExit"):
        GuardedEnv("test-exits", {}, CallLimits(call_timeout_s=5))


def _trajectory(tid: str, calls: list[tuple[str, dict]], env: dict) -> dict:
    messages: list[dict] = [{"role": "user", "content": "go"}]
    for i, (name, args) in enumerate(calls):
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "name": name,
                         "content": "{}", "rehearsed": True})
    return {"schema": "envace.trajectory/1", "id": tid, "task_id": tid, "env": env,
            "source": "rehearsed", "messages": messages}


MATH = {"name": "bfcl", "state": {"involved_classes": ["MathAPI"]}}


def _stall_file(tmp_path: Path, n_ok: int = 3) -> Path:
    recs = [_trajectory("stall", [("add", {"a": 1, "b": 2}), STALL, ("add", {"a": 2, "b": 2})],
                        MATH)]
    recs += [_trajectory(f"ok{i}", [("add", {"a": i, "b": 1})], MATH) for i in range(n_ok)]
    p = tmp_path / "in.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


@pytest.mark.parametrize("workers", [1, 2])
def test_the_audit_marks_a_stalled_call_timeout_and_goes_on(tmp_path, workers):
    src = _stall_file(tmp_path)
    t0 = time.monotonic()
    summary = run_audit([str(src)], tmp_path / "out",
                        AuditOptions(workers=workers, progress=False, plots=False,
                                     call_timeout_s=1.5))
    assert time.monotonic() - t0 < 60
    assert summary["counts"]["trajectories"] == 4 and summary["counts"]["skipped"] == 0
    rows = [json.loads(x) for x in (tmp_path / "out" / "steps.jsonl").read_text().splitlines()]
    stall = [r for r in rows if r["trajectory_id"] == "stall"]
    assert [r.get("timeout") for r in stall] == [None, True, None]
    assert stall[1]["actual_error"] is True and "call limit" in stall[1]["actual"]
    assert json.loads(stall[2]["actual"]) == {"result": 4}  # the rest of it still audited
    assert all("timeout" not in r for r in rows if r["trajectory_id"] != "stall")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_tool_that_kills_its_process_costs_one_step_not_a_worker(tmp_path, workers):
    env = {"name": "test-hostile", "task": "t"}
    recs = [_trajectory("killer", [("count", {}), ("die", {}), ("count", {})], env)]
    recs += [_trajectory(f"after{i}", [("count", {})], env) for i in range(20)]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    summary = run_audit([str(src)], tmp_path / "out",
                        AuditOptions(workers=workers, progress=False, plots=False,
                                     call_timeout_s=5))
    assert summary["counts"]["trajectories"] == 21 and summary["counts"]["skipped"] == 0
    rows = [json.loads(x) for x in (tmp_path / "out" / "steps.jsonl").read_text().splitlines()]
    killer = [r for r in rows if r["trajectory_id"] == "killer"]
    assert [r.get("crashed") for r in killer] == [None, True, None]
    assert [r.get("timeout") for r in killer] == [None, None, None]
    assert json.loads(killer[2]["actual"]) == {"n": 2}


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_during_a_c_level_call_exits_130_at_once(tmp_path, workers):
    """Before: with one worker the pending alarm's timeout replaced the KeyboardInterrupt, the
    call was a tool error and the audit exited 0, 128 s later."""
    src = _stall_file(tmp_path, n_ok=0)
    p = subprocess.Popen([sys.executable, "-m", "audit.cli", "--quiet", "replay", str(src),
                          "--out", str(tmp_path / "out"), "--workers", str(workers),
                          "--call-timeout", "300"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=_default_sigint,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    me = psutil.Process(p.pid)

    def guard_children() -> list[psutil.Process]:  # the environment's process (a leaf)
        try:
            procs = me.children(recursive=True)
            return [c for c in procs if not c.children()
                    and (workers == 1 or c.ppid() != p.pid)]
        except psutil.NoSuchProcess:
            return []

    end = time.monotonic() + 120
    while time.monotonic() < end and not guard_children() and p.poll() is None:
        time.sleep(0.2)
    envs = guard_children()
    assert envs, "the environment's process never started"
    time.sleep(3.0)  # two calls of milliseconds, then 127 s inside decimal's C code
    assert p.poll() is None
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)
    rc = p.wait(timeout=30)
    assert rc == 130, p.stderr.read()
    assert time.monotonic() - t0 < 15
    assert not (tmp_path / "out").exists()
    assert psutil.wait_procs(envs, timeout=10)[1] == []  # the C call's process is gone


def test_without_the_guard_a_worker_killer_still_costs_one_record(tmp_path):
    """Limits off (--call-timeout 0 --call-memory-mb 0): the tool kills the audit's worker.
    Before: every record in flight on that pool was "worker process died" (16 of them)."""
    env = {"name": "test-hostile", "task": "t"}
    recs = [_trajectory(f"a{i}", [("count", {})], env) for i in range(5)]
    recs += [_trajectory("killer", [("die", {})], env)]
    recs += [_trajectory(f"b{i}", [("count", {})], env) for i in range(15)]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    summary = run_audit([str(src)], tmp_path / "out",
                        AuditOptions(workers=2, progress=False, plots=False,
                                     call_timeout_s=None, call_memory_mb=None))
    assert summary["counts"]["trajectories"] == 20 and summary["counts"]["skipped"] == 1
    (skip,) = summary["skipped_records"]
    assert skip["line"] == 6 and "worker process died" in skip["reason"]


def test_a_worker_killer_is_judged_as_one_worker_would_judge_it(tmp_path):
    """Pool workers read their lines themselves (issue 44): a record that kills its worker is
    read again by the parent, so a killer that repeats an earlier id is a duplicate, as with
    one worker (which never replays it), and another shard's killer is not this shard's."""
    from audit.shard import shard_of

    env = {"name": "test-hostile", "task": "t"}
    recs = [_trajectory(f"a{i}", [("count", {})], env) for i in range(5)]
    recs += [_trajectory("a2", [("die", {})], env)]  # line 6: a duplicate id that kills
    recs += [_trajectory(f"b{i}", [("count", {})], env) for i in range(10)]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    off = {"call_timeout_s": None, "call_memory_mb": None, "progress": False, "plots": False}
    s = run_audit([str(src)], tmp_path / "out", AuditOptions(workers=2, **off))
    (skip,) = s["skipped_records"]
    assert skip["line"] == 6 and skip["reason"].startswith("duplicate trajectory id 'a2'")
    assert s["counts"]["trajectories"] == 15 and s["reconciles"]
    recs[5] = _trajectory("killer", [("die", {})], env)
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    other = 1 - shard_of("killer", 2)
    s = run_audit([str(src)], tmp_path / "o2", AuditOptions(workers=2, shard=(other, 2), **off))
    assert s["skipped_records"] == []
    assert s["counts"]["records_read"] == sum(shard_of(r["id"], 2) == other for r in recs)


def test_a_batch_left_unread_never_answers_a_later_call():
    env = GuardedEnv("test-hostile", {}, CallLimits(call_timeout_s=5))
    env.reset("t")
    it = env.execute_many([("count", {})] * 5)
    assert next(it).content == '{"n": 1}'
    it.close()  # four answers were never read
    assert env.execute("count", {}).content == '{"n": 2}'  # state of the calls read, restored
    assert env.execute("count", {}).content == '{"n": 3}'
    env.close()


def test_a_reset_and_its_calls_in_one_message_keep_every_guarantee():
    """``begin_many`` (the audit's one round trip per trajectory): the reset is answered before
    it returns, a reset that raises runs none of the calls, a call that kills its process or
    stalls costs that call (the rest answered by a fresh child brought back to the reset and
    the calls before), and the environment is usable after."""
    env = GuardedEnv("test-hostile", {}, CallLimits(call_timeout_s=1.0))
    env.reset("t")
    env.execute("count", {})  # state to be wiped by the reset below
    sent = []
    real_send = env._send
    with mock.patch.object(env, "_send", side_effect=lambda m: sent.append(m[0]) or
                           real_send(m)):
        results = list(env.begin_many("reset", "t", [("count", {}), ("die", {}),
                                                     ("count", {}), ("sleep", {"s": 60}),
                                                     ("count", {})]))
    # one message for the reset and its calls; a reset again only to restore each new child
    assert sent[0] == "begin_batch" and sent.count("begin") == env.restarts == 2
    assert [r.content for r in results[:1]] == ['{"n": 1}']
    assert results[1].crashed and results[2].content == '{"n": 2}'
    assert results[3].timeout and results[4].content == '{"n": 3}'
    assert env.tool_names() == {"count", "die", "segv", "eat", "sleep"}

    with pytest.raises(ValueError, match="no such task"):
        env.begin_many("reset", "refuse", [("count", {})] * 3)
    assert env.execute("count", {}).content == '{"n": 4}'  # the refused reset's calls never ran
    env.close()


def test_calls_sent_ahead_are_answered_in_order_whatever_comes_between():
    """``send_ahead`` / ``take_ahead`` (the audit sends the next trajectories' resets and calls
    while it scores this one's): a request that comes first reads the batch's answers before
    its own; a refused reset raises when taken, read early or not, and runs none of its calls;
    a batch whose child was killed is sent again when taken."""
    env = GuardedEnv("test-hostile", {}, CallLimits(call_timeout_s=1.0))
    env.reset("t")
    a = env.send_ahead("reset", "t", [("count", {})] * 3)
    assert a is not None
    assert env.state() == {"n": 3}  # asked between: the batch's answers were read first
    assert [r.content for r in env.take_ahead(a)] == ['{"n": 1}', '{"n": 2}', '{"n": 3}']
    b = env.send_ahead("reset", "t", [("count", {}), ("die", {}), ("count", {})])
    res = list(env.take_ahead(b))
    assert res[1].crashed and res[2].content == '{"n": 2}' and env.restarts == 1
    c = env.send_ahead("reset", "refuse", [("count", {})] * 2)
    with pytest.raises(ValueError, match="no such task"):
        list(env.take_ahead(c))
    assert env.execute("count", {}).content == '{"n": 3}'  # its calls never ran
    d = env.send_ahead("reset", "refuse", [("count", {})])
    assert env.execute("count", {}).content == '{"n": 4}'  # read early: still not run
    with pytest.raises(ValueError, match="no such task"):
        env.take_ahead(d)
    e = env.send_ahead("reset", "t", [("count", {})] * 2)
    env._kill()  # e.g. a stall in a request between: the child and the answers are gone
    assert [r.content for r in env.take_ahead(e)] == ['{"n": 1}', '{"n": 2}']
    env.close()


def test_several_batches_ahead_are_taken_in_order_and_each_keeps_its_own_state():
    """Up to ``MAX_AHEAD`` batches wait in the child, answered in the order sent; each ends with
    the kinds of the tools asked and not known yet, as they stand after it (no question crosses
    the pipe while batches wait); a batch read early and taken after later ones ran is brought
    back before the next request (its calls replayed in a fresh child); the queue and the bytes
    waiting are bounded."""
    from envace.core.envs import guard_ahead as guard

    env = GuardedEnv("test-hostile", {}, CallLimits(call_timeout_s=2.0))
    env.reset("t")
    a = env.send_ahead("reset", "t", [("count", {})] * 3, tools=("count",))
    b = env.send_ahead("reset", "t", [("count", {})])
    c = env.send_ahead("reset", "t", [("count", {})] * 2)
    assert a and b and c and a.tools == ("count",)
    sent = []
    real_send = env._send
    with mock.patch.object(env, "_send", side_effect=lambda m: sent.append(m[0]) or
                           real_send(m)):
        assert [r.content for r in env.take_ahead(a)] == ['{"n": 1}', '{"n": 2}', '{"n": 3}']
        assert env.tool_kind("count") is ToolKind.WRITE  # came after a's calls
        assert [r.content for r in env.take_ahead(b)] == ['{"n": 1}']
    assert sent == []  # nothing asked: b and c were read in turn from the pipe
    assert env.state() == {"n": 2}  # c's answers read first (c ran last)
    assert [r.content for r in env.take_ahead(c)] == ['{"n": 1}', '{"n": 2}']
    known = env.send_ahead("reset", "t", [("count", {})], tools=("count", "eat", "count"))
    assert known.tools == ("eat",)  # a kind known already is not asked again
    list(env.take_ahead(known))

    d = env.send_ahead("reset", "t", [("count", {})] * 3)
    e = env.send_ahead("reset", "t", [("count", {})])
    assert env.state() == {"n": 1}  # both read early; e ran last
    restarts = env.restarts
    assert [r.content for r in env.take_ahead(d)] == ['{"n": 1}', '{"n": 2}', '{"n": 3}']
    assert env.execute("count", {}).content == '{"n": 4}'  # d's state, not e's
    assert env.restarts == restarts + 1
    assert [r.content for r in env.take_ahead(e)] == ['{"n": 1}']
    assert env.execute("count", {}).content == '{"n": 2}'  # and now e's

    queued = [env.send_ahead("reset", "t", [("count", {})]) for _ in range(guard.MAX_AHEAD + 1)]
    assert all(queued[:-1]) and queued[-1] is None  # the queue is full
    for q in queued[:-1]:
        assert [r.content for r in env.take_ahead(q)] == ['{"n": 1}']
    big = [("count", {"pad": "x" * guard.AHEAD_BYTES})]
    first = env.send_ahead("reset", "t", big)
    assert first is not None  # the first goes whatever its size: the child reads it now
    assert env.send_ahead("reset", "t", big) is None  # not while the child is busy
    assert [r.content for r in env.take_ahead(first)] == ['{"n": 1}']
    env.close()


def test_a_batch_taken_after_later_batches_ran_gets_its_own_state_back():
    """Found by a hostile review of the queue: a later batch whose reset failed half-way, or a
    later batch taken first, had run in the child, yet the earlier batch, taken from what was
    read early, was not brought back; and a reset asked next needs no restore at all."""
    env = GuardedEnv("test-hostile", {}, CallLimits(call_timeout_s=2.0))
    env.reset("t")
    a = env.send_ahead("reset", "t", [("count", {})] * 3)
    b = env.send_ahead("reset", "half", [("count", {})])
    assert env.state() == {"n": 0}  # b's reset ran (and failed) after a
    assert [r.content for r in env.take_ahead(a)] == ['{"n": 1}', '{"n": 2}', '{"n": 3}']
    assert env.execute("count", {}).content == '{"n": 4}'  # a's state
    with pytest.raises(ValueError, match="half-done"):
        env.take_ahead(b)

    a = env.send_ahead("reset", "t", [("count", {})] * 3)
    b = env.send_ahead("reset", "t", [("count", {})])
    assert [r.content for r in env.take_ahead(b)] == ['{"n": 1}']  # out of order: a read first
    assert [r.content for r in env.take_ahead(a)] == ['{"n": 1}', '{"n": 2}', '{"n": 3}']
    assert env.execute("count", {}).content == '{"n": 4}'  # a's state, not b's

    c = env.send_ahead("reset", "t", [("count", {})] * 2)
    d = env.send_ahead("reset", "t", [("count", {})])
    env.state()
    list(env.take_ahead(c))
    restarts = env.restarts
    assert [r.content for r in env.begin_many("reset", "t", [("count", {})])] == ['{"n": 1}']
    assert env.restarts == restarts  # a reset came next: nothing to restore
    assert [r.content for r in env.take_ahead(d)] == ['{"n": 1}']
    env.close()


def test_the_kinds_of_every_tool_of_a_trajectory_come_after_its_batch():
    """A malformed call is not run, so its tool is not in the batch; the audit still asks its
    kind before it scores. Sent with the batch (``tools``), it comes back after the batch, not
    asked in between (which would read every batch waiting behind it first)."""
    env = GuardedEnv("test-hostile", {}, CallLimits(call_timeout_s=2.0))
    env.reset("t")
    a = env.send_ahead("reset", "t", [("count", {})], tools=("count", "eat"))
    b = env.send_ahead("reset", "t", [("count", {})])
    sent = []
    real_send = env._send
    with mock.patch.object(env, "_send", side_effect=lambda m: sent.append(m[0]) or
                           real_send(m)):
        list(env.take_ahead(a))
        assert env.tool_kind("eat") is ToolKind.WRITE
        assert [r.content for r in env.take_ahead(b)] == ['{"n": 1}']
    assert sent == []
    env.close()


def test_skipped_records_are_listed_in_input_order_with_one_worker(tmp_path):
    """Found by a hostile review: one worker reads records ahead, and an unreadable line was
    listed before the failed replay of an earlier record; ``summary.json`` then differed from
    two workers'."""
    env = {"name": "test-hostile", "task": "t"}
    lines = [json.dumps(_trajectory("r1", [("count", {})], {**env, "task": "refuse"})),
             json.dumps(_trajectory("g1", [("count", {})], env)), "{not json",
             json.dumps(_trajectory("g2", [("count", {})], env))]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    for workers in (1, 2):
        summary = run_audit([str(src)], tmp_path / f"out{workers}",
                            AuditOptions(workers=workers, progress=False, plots=False,
                                         call_timeout_s=5))
        assert [r["line"] for r in summary["skipped_records"]] == [1, 3], workers


def test_the_probe_marks_ended_calls_as_the_replay_does():
    """The probe's step rows used to carry neither mark: a death or a cut call looked like the
    environment's own error answer."""
    from audit.probe import probe_trajectory
    from envace.core.schema import Trajectory

    traj = Trajectory.model_validate(_trajectory(
        "p", [("count", {}), ("die", {}), ("sleep", {"s": 60}), ("count", {})],
        {"name": "test-hostile", "task": "t"}))
    envs: dict = {}
    try:
        res = probe_trajectory(traj, lambda *a: "{}", AuditOptions(call_timeout_s=1.0), envs)
    finally:
        for e in envs.values():
            e.close()
    assert [r.get("crashed") for r in res.steps] == [None, True, None, None]
    assert [r.get("timeout") for r in res.steps] == [None, None, True, None]
    assert json.loads(res.steps[3]["actual"]) == {"n": 2}


def test_an_environment_left_open_at_exit_ends_quietly():
    """A GuardedEnv collected at interpreter exit used to print 'Exception ignored in
    GuardedEnv.__del__' (the module's globals were gone); its child must not outlive it."""
    code = ("import torch\nimport envace.model.models\n"  # a trainer's module teardown order
            "from envace.core.envs.guard import guarded_env\n"
            "env = guarded_env('bfcl')\nenv.reset({'involved_classes': ['MathAPI']})\n"
            "print(env._proc.pid)\nopen_env = guarded_env('bfcl')\nenv.close()\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    child = int(p.stdout.split()[-1])
    time.sleep(0.5)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"


def test_collecting_an_environment_never_waits_and_kills_its_child():
    """Python drops an exception raised in ``__del__``: a Ctrl-C that landed in its join of the
    child (up to 5 s) was lost and the command ran on to exit 0 (tester B15). ``__del__`` must
    not wait at all, and the child must still die."""
    env = guarded_env("bfcl", CallLimits(call_timeout_s=5))
    env.reset({"involved_classes": ["MathAPI"]})
    proc = env._proc
    with mock.patch.object(type(proc), "join", autospec=True) as join:
        env.__del__()
    assert not join.called
    proc.join(5)
    assert not proc.is_alive()
