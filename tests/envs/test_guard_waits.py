"""The guarded environment's cheap paths (issue 44): waiting for an answer by one ``select.poll``
per pipe answers as ``Connection.poll`` did (ready, past the limit, the child gone), and
``can_send_ahead`` says exactly when ``send_ahead`` could send, so that the audit builds no
batch that would not go."""

from __future__ import annotations

import time

from envace.core.envs import guard_ahead
from envace.core.envs.guard import GuardedEnv
from envace.core.envs.limits import CallLimits
from tests.envs.hostile_env import HostileEnv  # noqa: F401 - registers test-hostile


def test_ready_answers_as_connection_poll_did():
    env = GuardedEnv("test-hostile", limits=CallLimits(call_timeout_s=2.0, memory_mb=None))
    try:
        env.reset("t")
        assert not env._ready(0)  # nothing asked: nothing there
        assert not env._ready(-1.0)  # a negative wait is no wait, as in poll
        t0 = time.monotonic()
        assert not env._ready(0.2)
        assert 0.15 < time.monotonic() - t0 < 2.0  # waited the time asked
        env._conn.send(("call", "state", (), {}))
        assert env._ready(5.0) and env._conn.poll(0)  # the same answer to both
        assert env._conn.recv() == ("ok", {"n": 0})
        first = env._poller
        assert env.execute("count", {}).content == '{"n": 1}'
        assert env._poller is first  # one poller per pipe
        # past the limit: the child is killed, a fresh one (and pipe, and poller) comes
        res = env.execute("sleep", {"s": 30})
        assert res.timeout and env.restarts == 1
        assert env.execute("count", {}).content == '{"n": 2}'
        assert env._poller is not first and env._poller[0] is env._conn
        # the child gone: the hang-up counts as ready, and reading it says so
        env._proc.kill()
        env._proc.join(5)
        assert env._ready(5.0)
        assert env._wait(5.0)[0] == "died"
    finally:
        env.close()


def test_can_send_ahead_is_true_exactly_when_send_ahead_may_send():
    env = GuardedEnv("test-hostile", limits=CallLimits(call_timeout_s=10.0, memory_mb=None))
    try:
        sent = []
        while env.can_send_ahead():
            got = env.send_ahead("reset", "t", [("count", {})])
            assert got is not None
            sent.append(got)
        assert len(sent) == guard_ahead.MAX_AHEAD
        assert env.send_ahead("reset", "t", [("count", {})]) is None  # full, as it said
        assert [r.content for r in env.take_ahead(sent[0])] == ['{"n": 1}']
        assert env.can_send_ahead()  # room again
        for s in sent[1:]:
            assert [r.content for r in env.take_ahead(s)] == ['{"n": 1}']
        env._kill()
        assert not env.can_send_ahead()  # no child
        assert env.send_ahead("reset", "t", [("count", {})]) is None
    finally:
        env.close()
