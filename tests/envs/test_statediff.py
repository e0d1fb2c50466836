"""The state diff (envace.core.envs.statediff): a pure function over JSON-able states, its
tracker, and the change it records in the guarded environment's process."""

from __future__ import annotations

import copy
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from envace.core.envs.base import ToolResult
from envace.core.envs.guard import guarded_env
from envace.core.envs.limits import CallLimits
from envace.core.envs.statediff import (
    MAX_DEPTH,
    MAX_PATHS,
    StateTracker,
    bucket,
    diff_states,
    key_path,
)

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=3),
                    st.floats(allow_nan=False, allow_infinity=False, width=16))
states = st.recursive(scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=3), kids, max_size=4)),
    max_leaves=25)


def _leaf_paths(value, where=""):
    """Every leaf path of a state (an empty container is a leaf too)."""
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from _leaf_paths(v, key_path(where, str(k)))
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            yield from _leaf_paths(v, f"{where}[{i}]")
    else:
        yield where or "(state)"


def _set(state, path_parts, value):
    node = state
    for p in path_parts[:-1]:
        node = node[p]
    node[path_parts[-1]] = value


def _parts(value, prefix=()):
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from _parts(v, (*prefix, k))
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            yield from _parts(v, (*prefix, i))
    elif prefix:
        yield prefix


@settings(max_examples=200, deadline=None)
@given(states)
def test_a_state_against_itself_or_a_copy_changes_nothing(s):
    assert diff_states(s, s).leaves == 0
    assert diff_states(s, copy.deepcopy(s)).leaves == 0


@settings(max_examples=200, deadline=None)
@given(states, states)
def test_zero_changes_exactly_when_the_states_are_equal(a, b):
    change = diff_states(a, b)
    assert (change.leaves == 0) == (a == b)
    assert change.leaves == diff_states(b, a).leaves  # symmetric
    assert len(change.paths) == min(change.leaves, MAX_PATHS)
    assert list(change.paths) == sorted(change.paths)


@settings(max_examples=200, deadline=None)
@given(states, st.data())
def test_one_leaf_changed_is_found_at_its_path(s, data):
    places = list(_parts(s))
    if not places:
        return
    where = data.draw(st.sampled_from(places))
    changed = copy.deepcopy(s)
    _set(changed, where, "\x00 a value no drawn state holds")
    change = diff_states(s, changed)
    assert change.leaves == 1
    path = ""
    for p in where:
        path = f"{path}[{p}]" if isinstance(p, int) else key_path(path, p)
    assert change.paths == (path,)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=4), states, min_size=1, max_size=6), st.data())
def test_an_added_or_removed_key_is_one_leaf_whatever_it_holds(s, data):
    key = data.draw(st.sampled_from(sorted(s)))
    smaller = {k: v for k, v in s.items() if k != key}
    assert diff_states(smaller, s).leaves == 1
    assert diff_states(s, smaller).paths == (key_path("", key),)


def test_known_answers():
    before = {"files": {"a.txt": "x", "b.txt": "y"}, "cwd": "/", "log": [1, 2],
              "n": float("nan")}
    after = {"files": {"a.txt": "x2", "c.txt": "z"}, "cwd": "/docs", "log": [1, 2, 3],
             "n": float("nan")}
    change = diff_states(before, after)
    assert change.leaves == 5  # a.txt edited, b.txt removed, c.txt added, cwd, log[2]
    assert change.paths == ("cwd", 'files["a.txt"]', 'files["b.txt"]', 'files["c.txt"]',
                            "log[2]")
    assert change.bucket == "3+"
    assert diff_states({"a": {"b": 1}}, {"a": "gone"}).paths == ("a",)  # a type change: 1 leaf
    assert diff_states(1, 2).paths == ("(state)",)
    assert [bucket(n) for n in (0, 1, 2, 3, 40, None)] == ["0", "1", "2", "3+", "3+", "unknown"]
    assert math.isnan(before["n"])


def test_a_deep_state_does_not_recurse():
    deep_a, deep_b = {"x": 0}, {"x": 1}
    for _ in range(5000):
        deep_a, deep_b = [deep_a], [deep_b]
    assert diff_states(deep_a, deep_b).leaves == 1


class _Counter:
    """A fake environment (unit test of the tracker only): a counter a write bumps."""

    def __init__(self):
        self.n, self.reads = 0, 0

    def state(self):
        self.reads += 1
        return {"n": self.n}

    def execute(self, tool, arguments):
        if tool == "bump":
            self.n += 1
        return ToolResult("ok")


def test_the_tracker_reads_the_state_once_per_call():
    env = _Counter()
    tracker = StateTracker(env)
    results = [tracker.execute(t, {}) for t in ("bump", "read", "bump")]
    assert [r.state_change for r in results] == [
        {"leaves": 1, "paths": ["n"]}, {"leaves": 0, "paths": []}, {"leaves": 1, "paths": ["n"]}]
    assert env.reads == 4  # one before the first call, one after each
    assert isinstance(results[0], ToolResult) and results[0].content == "ok"


def test_an_unreadable_state_is_an_unknown_change_not_a_failure():
    env = _Counter()
    env.state = lambda: (_ for _ in ()).throw(RuntimeError("no state"))
    res = StateTracker(env).execute("bump", {})
    assert res.content == "ok" and res.state_change is None


def test_the_guarded_environment_diffs_in_its_own_process():
    env = guarded_env("bfcl", CallLimits(call_timeout_s=30))
    try:
        env.reset("multi_turn_base_0")
        calls = [("ls", {}), ("mkdir", {"dir_name": "made_here"}),
                 ("touch", {"file_name": "new.txt"})]
        got = [r.state_change for r in env.execute_many(calls, track_state=True)]
        assert got[0] == {"leaves": 0, "paths": []}
        assert got[1]["leaves"] >= 1 and any("made_here" in p for p in got[1]["paths"])
        assert got[2]["leaves"] >= 1
        plain = list(env.execute_many([("ls", {})]))
        assert getattr(plain[0], "state_change", None) is None  # off unless asked
    finally:
        env.close()


def test_a_cyclic_state_ends_and_a_too_deep_one_is_unknown():
    """Hostile plugin states (tester P4, P5, P7): a self-referencing state is walked once per
    pair of containers; one nested past MAX_DEPTH is refused, which the tracker records as an
    unknown change, never an endless walk."""
    a, b = {"n": 1}, {"n": 2}
    a["self"], b["self"] = a, b
    assert diff_states(a, b).leaves == 1
    deep = {"x": 0}
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    env = _Counter()
    env.state = lambda: deep
    assert StateTracker(env).execute("read", {}).state_change is None


def test_a_state_changed_in_place_is_copied_not_compared_with_itself():
    """A plugin whose state() returns the same dict, changed in place (tester P9): it used to
    read 0 changed leaves for every call. The first call that shows it is unknown, then each
    state is copied and the changes are seen."""
    env = _Counter()
    same = {"n": 0}

    def state():
        same["n"] = env.n
        return same

    env.state = state
    tracker = StateTracker(env)
    changes = [tracker.execute("bump", {}).state_change for _ in range(3)]
    assert changes[0] is None and changes[1:] == [{"leaves": 1, "paths": ["n"]}] * 2


def test_a_state_that_exits_is_an_unknown_change():
    """SystemExit or KeyboardInterrupt raised by a plugin's state() (tester P8)."""
    for exc in (SystemExit(0), KeyboardInterrupt()):
        env = _Counter()
        env.state = lambda e=exc: (_ for _ in ()).throw(e)
        res = StateTracker(env).execute("bump", {})
        assert res.content == "ok" and res.state_change is None
