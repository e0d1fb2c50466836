"""The BFCL adapter: agreement with bfcl-eval's executor and checker, errors as data, no eval."""

from __future__ import annotations

import copy
import json
import os
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from envace.core.envs.base import ToolKind, UnknownEnvironment, make_env
from envace.core.envs.bfcl.callparse import CallParseError, format_call, parse_call_source
from envace.core.envs.bfcl.env import BFCLEnv
from envace.core.envs.bfcl.tasks import UnknownTask, get_task, load_tasks
from envace.core.envs.bfcl.verify import check_calls, ground_truth_calls


def test_800_tasks_with_tools_and_ground_truth():
    tasks = load_tasks()
    assert len(tasks) == 800
    assert {t.category for t in tasks.values()} == {"base", "miss_func", "miss_param",
                                                    "long_context"}
    t = tasks["multi_turn_miss_func_0"]
    assert t.missed_functions == {3: ["sort"]}
    assert "sort" not in {s["function"]["name"] for s in t.tools(turn=2)}
    assert "sort" in {s["function"]["name"] for s in t.tools(turn=3)}
    base0 = tasks["multi_turn_base_0"]
    assert "cp" in base0.excluded_functions and "cp" not in base0.tool_names()
    schema = next(s for s in base0.tools() if s["function"]["name"] == "mv")
    assert schema["function"]["parameters"]["type"] == "object"


def test_every_ground_truth_step_agrees_with_bfcl_executor():
    """All 800 tasks: our response == execute_multi_turn_func_call's, step by step."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
        execute_multi_turn_func_call,
    )

    env = BFCLEnv()
    n = 0
    for k, task in enumerate(load_tasks().values()):
        env.reset(task)
        for turn, calls in zip(task.ground_truth, ground_truth_calls(task, env), strict=True):
            ours = [env.execute(name, args).content for name, args in calls]
            theirs, _ = execute_multi_turn_func_call(
                [c.source for c in turn], task.initial_config, task.involved_classes,
                f"agree{os.getpid()}_{k}", task.id, long_context=task.long_context)
            assert ours == theirs, task.id
            n += len(ours)
    assert n > 4000


def _bfcl_checker(task, calls_per_turn, tag):
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    entry = {"id": task.id, "initial_config": task.initial_config,
             "involved_classes": task.involved_classes}
    decoded = [[[format_call(n, a) for n, a in turn]] if turn else [] for turn in calls_per_turn]
    gt = [[c.source for c in turn] for turn in task.ground_truth]
    return multi_turn_checker(decoded, gt, entry, task.category, f"chk{os.getpid()}{tag}")


def _alter(calls, rng):
    """A changed call list: drop one call, or change one string argument."""
    flat = [(i, j) for i, turn in enumerate(calls) for j in range(len(turn))]
    i, j = rng.choice(flat)
    out = copy.deepcopy(calls)
    name, args = out[i][j]
    str_keys = [k for k, v in args.items() if isinstance(v, str)]
    if str_keys and rng.random() < 0.5:
        args[rng.choice(str_keys)] += "_x"
        return out, "changed"
    del out[i][j]
    return out, "dropped"


def test_state_check_agrees_with_bfcl_checker():
    rng = random.Random(0)
    tasks = [t for t in load_tasks().values() if t.category != "long_context"]
    env = BFCLEnv()
    agree = disagree = fail = 0
    for n, task in enumerate(rng.sample(tasks, 120)):
        env.reset(task)
        truth = ground_truth_calls(task, env)
        assert check_calls(task, truth).valid, task.id
        assert _bfcl_checker(task, truth, f"gt{n}")["valid"], task.id
        altered, how = _alter(truth, rng)
        ours = check_calls(task, altered).valid
        theirs = _bfcl_checker(task, altered, f"alt{n}")["valid"]
        agree += ours == theirs
        disagree += ours != theirs
        fail += not ours
    assert disagree == 0
    assert fail > 80  # most alterations break the task (some are harmless, e.g. a dropped ls)


def test_errors_are_results():
    env = make_env("bfcl")
    env.reset("multi_turn_base_0")
    r = env.execute("no_such_tool", {})
    assert r.error and "unknown tool" in r.content
    r = env.execute("cp", {"source": "a", "destination": "b"})  # excluded from this task
    assert r.error and "excluded" in r.content
    r = env.execute("cd", {"nonsense": 1})
    assert r.error and r.content.startswith("Error during execution:")
    r = env.execute("cd", {"folder": "no_such_dir"})
    assert r.error and "error" in r.content
    ok = env.execute("cd", {"folder": "document"})
    assert not ok.error and "document" in ok.content
    assert env.tool_kind("mkdir") is ToolKind.WRITE and env.tool_kind("ls") is ToolKind.READ
    assert env.tool_kind("nope") is None


def test_state_hash_tracks_writes_and_resets():
    env = BFCLEnv()
    env.reset("multi_turn_base_0")
    h0 = env.state_hash()
    env.execute("ls", {})
    assert env.state_hash() == h0
    env.execute("cd", {"folder": "document"})
    env.execute("mkdir", {"dir_name": "temp"})
    assert env.state_hash() != h0
    env.reset("multi_turn_base_0")
    assert env.state_hash() == h0


def test_inline_state():
    env = BFCLEnv()
    env.reset({"involved_classes": ["MathAPI"], "initial_config": {}})
    assert env.execute("add", {"a": 2, "b": 3}).content == '{"result": 5}'
    with pytest.raises(ValueError, match="unknown BFCL backend"):
        env.reset({"involved_classes": ["os"]})


def test_unknown_names_are_clear():
    with pytest.raises(UnknownEnvironment, match="registered: bfcl"):
        make_env("no_such_env_zz")
    with pytest.raises(UnknownTask, match="multi_turn_base_17"):
        get_task("multi_turn_base_9999")


def test_call_parser_accepts_literals_only():
    assert parse_call_source("sort('a.txt')") == ("sort", ["a.txt"], {})
    assert parse_call_source("f(x=[1, {'a': None}], y=-2.5)") == (
        "f", [], {"x": [1, {"a": None}], "y": -2.5})
    for bad in ["__import__('os').system('id')", "f(x=open('/etc/passwd'))", "a.b(1)",
                "f(**{'a': 1})", "f(x=y)", "not a call", "f(x=(lambda: 1)())"]:
        with pytest.raises(CallParseError):
            parse_call_source(bad)


HOSTILE = ["__import__('os').system('touch /tmp/envace_pwned')", "os.system", "__class__",
           "__init__", "_load_scenario", "__dict__", "eval", "exec", "__globals__",
           "subprocess.run", "; rm -rf /", "$(touch /tmp/envace_pwned)"]


# Real tools of multi_turn_base_0 (its file system) and their own argument names: with these
# the strategy forms valid write calls carrying hostile values, not only unknown names.
FS_TOOLS = ["touch", "mkdir", "echo", "cd", "rm", "cat", "ls"]
FS_KEYS = ["file_name", "dir_name", "folder", "content"]
#: the characters bfcl-eval's file system refuses in a file or folder name ("Invalid character",
#: its _validate_file_or_directory_name): such a write is its own error result, not a write
BFCL_REFUSED_IN_NAMES = '|/\\?%*:"><'


@settings(max_examples=200, deadline=None)
@given(name=st.one_of(st.sampled_from(HOSTILE + FS_TOOLS), st.text(max_size=30)),
       key=st.one_of(st.sampled_from(HOSTILE + FS_KEYS), st.text(max_size=10)),
       value=st.one_of(st.sampled_from(HOSTILE), st.text(max_size=30), st.integers()))
@example(name="touch", key="file_name", value="__import__('os').getcwd()")  # a valid write
@example(name="mkdir", key="dir_name", value="$(id)")
@example(name="touch", key="file_name", value=":")  # refused by bfcl-eval: an error, no write
def test_injection_attempts_execute_nothing(name, key, value):
    """Hostile names and values are data: an unknown tool or a bad argument is an error result
    that leaves the state alone; a real tool with its own argument runs as itself, the hostile
    string stored as a name, never executed."""
    env = BFCLEnv()
    env.reset("multi_turn_base_0")
    before = env.state_hash()
    r = env.execute(name, {key: value})
    if r.error:
        assert env.state_hash() == before
    else:
        assert name in FS_TOOLS and key in FS_KEYS
    if (name, key) in {("touch", "file_name"), ("mkdir", "dir_name")} and isinstance(value, str) \
            and value and not set(value) & set(BFCL_REFUSED_IN_NAMES):
        assert not r.error and env.state_hash() != before  # the write happened, as data
    assert not os.path.exists("/tmp/envace_pwned")


@settings(max_examples=100, deadline=None)
@given(value=st.sampled_from(HOSTILE))
def test_hostile_strings_are_only_data(value):
    env = BFCLEnv()
    env.reset("multi_turn_base_0")
    env.execute("cd", {"folder": "document"})
    env.execute("touch", {"file_name": "notes.txt"})
    r = env.execute("echo", {"content": value, "file_name": "notes.txt"})
    assert not r.error  # stored as text inside the simulated file system
    shown = env.execute("cat", {"file_name": "notes.txt"}).content
    assert json.loads(shown) == {"file_content": value}
    assert not os.path.exists("/tmp/envace_pwned")
