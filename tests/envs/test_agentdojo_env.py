"""AgentDojo as a real environment: against agentdojo's own runtime and checkers, determinism,
errors as data, export, splits, tool kinds, and the audit on its trajectories.

Everything runs the real agentdojo package (installed by scripts/setup.sh).
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.cli import main as audit_main
from audit.pipeline import run_audit
from audit.replay import replay_trajectory
from audit.scoring.settings import AuditOptions
from envace.cli import main as envace_main
from envace.core.envs.agentdojo.env import AgentDojoEnv, tool_kinds
from envace.core.envs.agentdojo.export import real_trajectory as agentdojo_trajectory
from envace.core.envs.agentdojo.tasks import (
    FROZEN_NOW,
    SUITES,
    default_environment,
    deterministic_world,
    get_task,
    load_tasks,
    split_ids,
    suites,
)
from envace.core.envs.agentdojo.verify import check_calls
from envace.core.envs.base import ToolKind, make_env
from envace.core.envs.task_common import UnknownTask
from envace.core.export import export_env
from envace.core.schema import Trajectory, TrajectoryWriter, load_trajectories

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tasks():
    return load_tasks()


@pytest.fixture(scope="module")
def real(tasks) -> list[Trajectory]:
    return list(export_env("agentdojo", list(tasks)))


def test_setup_installs_agentdojo_without_its_unused_requirements():
    """scripts/setup.sh takes agentdojo with --no-deps; pyproject.toml has what it imports.
    (A fresh interpreter importing the suites: the cross-process test below.)"""
    import importlib.metadata as md

    assert md.version("agentdojo") == "0.1.35"
    assert '--no-deps "agentdojo==0.1.35"' in (ROOT / "scripts" / "setup.sh").read_text()
    counts = {k: [len(v.tools), len(v.user_tasks)] for k, v in suites("v1.2.2").items()}
    assert counts == {"workspace": [24, 40], "travel": [28, 20], "banking": [11, 16],
                      "slack": [11, 21]}


def test_every_ground_truth_step_equals_agentdojos_own_runtime(tasks):
    """All 339 steps: the adapter's text and state equal FunctionsRuntime + tool_result_to_str
    (both under the same frozen clock); a step that changes state is of a WRITE tool."""
    from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
    from agentdojo.functions_runtime import FunctionsRuntime

    env = make_env("agentdojo")
    steps = 0
    kinds = tool_kinds()
    for task in tasks.values():
        suite = suites(task.version)[task.suite]
        with deterministic_world():
            theirs = task.user_task().init_environment(
                suite.load_and_inject_default_environment({}))
            truth = task.user_task().ground_truth(theirs.model_copy(deep=True))
        runtime = FunctionsRuntime(suite.tools)
        env.reset(task.id)
        assert env.state() == theirs.model_dump(mode="json")
        assert [(c.function, dict(c.args)) for c in truth] == task.calls()
        for fc in truth:
            with deterministic_world():
                result, error = runtime.run_function(theirs, fc.function, dict(fc.args))
            before = env.state_hash()
            mine = env.execute(fc.function, dict(fc.args))
            assert error is None and not mine.error, (task.id, fc.function, mine.content)
            assert mine.content == tool_result_to_str(result), (task.id, fc.function)
            assert env.state() == theirs.model_dump(mode="json"), (task.id, fc.function)
            if env.state_hash() != before:
                assert kinds[task.suite][fc.function] == "write", fc.function
            steps += 1
    assert len(tasks) == 97 and steps == 339


def _agentdojo_verdict(task, calls, final_text: str) -> bool:
    """agentdojo's own end to end: run_task_with_pipeline with a pipeline that makes ``calls``
    through agentdojo's ToolsExecutor, then answers ``final_text``."""
    from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
    from agentdojo.agent_pipeline.tool_execution import ToolsExecutor
    from agentdojo.functions_runtime import FunctionCall
    from agentdojo.types import text_content_block_from_string

    class Replay(BasePipelineElement):
        def query(self, query, runtime, env, messages=(), extra_args=None):
            messages = [*messages]
            for i, (name, args) in enumerate(calls):
                call = FunctionCall(function=name, args=copy.deepcopy(args), id=f"c{i}")
                messages.append({"role": "assistant", "tool_calls": [call],
                                 "content": [text_content_block_from_string("")]})
                _, _, env, messages, _ = ToolsExecutor().query(query, runtime, env, messages)
            messages.append({"role": "assistant", "tool_calls": None,
                             "content": [text_content_block_from_string(final_text)]})
            return query, runtime, env, messages, extra_args or {}

    suite = suites(task.version)[task.suite]
    try:
        with deterministic_world():
            utility, _ = suite.run_task_with_pipeline(  # env: a copy of its default load
                Replay(), task.user_task(), None, {},
                environment=default_environment(task.version, task.suite))
    except Exception:  # noqa: BLE001 - a checker tripping over odd state counts as failure
        return False
    return bool(utility)


def _alterations(task):
    calls, text = task.calls(), task.ground_truth_output
    yield "ground truth", calls, text
    if calls:
        yield "last call dropped", calls[:-1], text
        name, args = calls[-1]
        changed = {k: (v + " (changed)" if isinstance(v, str) else v) for k, v in args.items()}
        yield "last call's strings changed", [*calls[:-1], (name, changed)], text
    if text:
        yield "no final answer", calls, ""


def test_verifier_agrees_with_each_tasks_own_checker(tasks):
    """On the ground truth (every task passes) and on altered call lists (some fail)."""
    outcomes = Counter()
    for task in tasks.values():
        for label, calls, text in _alterations(task):
            mine = check_calls(task, calls, text).valid
            assert mine == _agentdojo_verdict(task, calls, text), (task.id, label)
            outcomes[label, mine] += 1
    assert outcomes["ground truth", True] == 97
    assert outcomes["last call dropped", False] > 40
    assert outcomes["no final answer", False] > 10
    assert outcomes["last call's strings changed", False] > 20
    assert sum(n for (label, ok), n in outcomes.items() if not ok) > 100


def test_unknown_argument_names_are_errors_though_agentdojo_ignores_them(tasks):
    """The one place the adapter is stricter than agentdojo's runtime, by design."""
    task = tasks["workspace/user_task_4"]
    calls = task.calls()
    name, args = calls[-1]
    bad = [*calls[:-1], (name, {**args, "bogus": 1})]
    assert _agentdojo_verdict(task, bad, task.ground_truth_output)  # silently accepted
    check = check_calls(task, bad, task.ground_truth_output)
    assert not check.valid and "unexpected argument(s) bogus" in check.responses[-1]


def test_fresh_processes_write_identical_trajectories_whatever_the_hash_seed(tmp_path):
    """Two fresh interpreters (each imports the suites as a fresh setup would) with different
    hash seeds write the same workspace trajectories: the clock is frozen and calendar
    participants keep their order."""
    ids = [t for t in split_ids("all") if t.startswith("workspace/")]
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / f"w{seed}.jsonl"
        subprocess.run([sys.executable, "-m", "envace.cli", "data", "export-real", "--env",
                        "agentdojo", "--tasks", *ids, "--out", str(out)], check=True,
                       capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed})
        outs.append(hashlib.sha256(out.read_bytes()).hexdigest())
    assert outs[0] == outs[1]


def test_the_world_is_frozen_only_while_tools_run():
    env = AgentDojoEnv()
    env.reset("workspace/user_task_0")
    r = env.execute("send_email", {"recipients": ["a@b.com", "a@b.com"], "subject": "s",
                                   "body": "b"})
    assert not r.error and "2024-05-15 12:00:00" in r.content
    r = env.execute("create_calendar_event", {
        "title": "t", "start_time": "2024-05-20 10:00", "end_time": "2024-05-20 11:00",
        "participants": ["z@x.com", "a@x.com", "z@x.com"]})
    owner = env.environment.calendar.account_email
    event = max(env.environment.calendar.events.values(), key=lambda e: int(e.id_))
    assert event.participants == ["z@x.com", "a@x.com", owner]
    from agentdojo.default_suites.v1.tools import calendar_client, email_client

    assert email_client.datetime is datetime and "set" not in vars(calendar_client)
    with deterministic_world():
        assert email_client.datetime.datetime.now() == FROZEN_NOW


def test_errors_are_data():
    env = make_env("agentdojo")
    env.reset("banking/user_task_0")
    cases = {
        "Invalid tool rm_rf provided.": ("rm_rf", {}),
        "Empty function name": ("", {}),
        "unexpected argument(s) amount_usd": ("send_money", {
            "recipient": "x", "amount": 1, "subject": "s", "date": "2022-01-01",
            "amount_usd": 2}),
        "ValidationError": ("send_money", {"recipient": "x"}),
        "must be an object": ("get_balance", ["not", "a", "dict"]),
    }
    for expect, (tool, args) in cases.items():
        r = env.execute(tool, args)
        assert r.error and expect in r.content, (expect, r)
    env.reset("workspace/user_task_0")
    r = env.execute("cancel_calendar_event", {"event_id": "nope"})
    assert r.error and r.content.startswith("ValueError: ")
    # agentdojo's ToolsExecutor turns a list written as a string into a list
    r = env.execute("get_contact_information_for_restaurants",
                    {"restaurant_names": "['x']"})
    assert r.error and "Invalid tool" in r.content  # a travel tool: not in workspace
    env.reset("travel/user_task_0")
    as_list = env.execute("get_rating_reviews_for_hotels", {"hotel_names": ["Le Marais Boutique"]})
    as_text = env.execute("get_rating_reviews_for_hotels",
                          {"hotel_names": "['Le Marais Boutique']"})
    assert not as_list.error and as_text == as_list


@pytest.fixture(scope="module")
def fuzz_env():
    env = AgentDojoEnv()
    env.reset("workspace/user_task_0")
    return env


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | st.text(max_size=20), lambda c: st.lists(c, max_size=3)
                     | st.dictionaries(st.text(max_size=8), c, max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tool=st.sampled_from(["send_email", "search_emails", "create_file", "get_file_by_id",
                             "append_to_file", "x", "", "delete_file", "share_file",
                             "create_calendar_event", "reschedule_calendar_event"]),
       args=st.dictionaries(st.sampled_from(["recipients", "subject", "body", "file_id",
                                             "filename", "content", "query", "start_time",
                                             "email", "permission", "title", "event_id",
                                             "new_start_time", "zzz"]), _json, max_size=4))
def test_fuzzed_calls_never_raise(fuzz_env, tool, args):
    r = fuzz_env.execute(tool, args)
    assert isinstance(r.content, str) and isinstance(r.error, bool)
    json.dumps(fuzz_env.state())  # the state stays JSON


def test_inline_state_round_trips():
    env = AgentDojoEnv()
    env.reset("slack/user_task_0")
    env.execute("get_webpage", {"url": "www.informations.com"})
    state, h = env.state(), env.state_hash()
    other = make_env("agentdojo")
    other.reset({"suite": "slack", "version": "v1.2.2", "environment": state})
    assert other.state_hash() == h and other.state() == state
    with pytest.raises(UnknownTask, match="workspace/user_task_0"):
        env.reset("mail/user_task_0")
    with pytest.raises(UnknownTask, match="slack has 21"):
        env.reset("slack/user_task_99")
    with pytest.raises(ValueError, match="unknown AgentDojo version"):
        env.reset({"task": "slack/user_task_0", "version": "v9"})


def test_tool_kinds_are_observed_for_every_tool():
    kinds = tool_kinds()
    for name, suite in suites().items():
        assert set(kinds[name]) == {f.name for f in suite.tools}
    env = AgentDojoEnv()
    env.reset("workspace/user_task_0")
    assert env.tool_kind("get_unread_emails") == ToolKind.WRITE  # marks mail read
    assert env.tool_kind("search_emails") == ToolKind.READ
    env.reset("slack/user_task_0")
    assert env.tool_kind("get_webpage") == ToolKind.WRITE  # logs the request
    assert env.tool_kind("no_such_tool") is None


def test_export_cli_writes_the_dev_split(tmp_path, tasks):
    out = tmp_path / "dev.jsonl"
    assert envace_main(["data", "export-real", "--env", "agentdojo", "--split", "dev",
                        "--out", str(out)]) == 0
    trajs = list(load_trajectories(out))
    assert [t.task_id for t in trajs] == split_ids("dev")
    t = trajs[0]
    task = tasks[t.task_id]
    assert t.env == {"name": "agentdojo", "task": task.id, "version": "v1.2.2"}
    assert t.reward == 1.0 and t.messages[0].content == task.prompt
    assert t.messages[-1].role == "assistant" and t.messages[-1].content == (
        task.ground_truth_output)
    assert {s["function"]["name"] for s in t.tools} == task.tool_names()
    assert envace_main(["data", "export-real", "--env", "agentdojo", "--tasks", "x/y",
                        "--out", str(out)]) == 2


def test_splits_partition_the_tasks_by_suite(tasks):
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_splits import assign_agentdojo

    parts = {s: split_ids(s) for s in ("train", "dev", "test")}
    everything = [i for ids in parts.values() for i in ids]
    assert sorted(everything) == sorted(tasks) and len(everything) == len(set(everything))
    assert {i: s for s, ids in parts.items() for i in ids} == assign_agentdojo()
    for suite in SUITES:
        n = sum(t.suite == suite for t in tasks.values())
        for split in ("dev", "test"):
            assert sum(i.startswith(suite + "/") for i in parts[split]) == round(0.15 * n)


def test_replay_of_the_ground_truth_never_diverges(real, tmp_path):
    path = tmp_path / "all.jsonl"
    with TrajectoryWriter(path, mode="w") as w:
        for t in real:
            w.write(t)
    s = run_audit([str(path)], tmp_path / "audit", AuditOptions(progress=False, plots=False))
    assert s["counts"]["trajectories"] == 97 and s["counts"]["steps"] == 339
    assert s["counts"]["diverged"] == 0 and s["counts"]["skipped"] == 0
    assert all(t.reward == 1.0 for t in real)


def test_replay_finds_an_altered_response_and_honours_the_version(real):
    traj = next(t for t in real if len(t.tool_steps()) >= 3)
    bad = traj.model_copy(deep=True)
    tool_msgs = [m for m in bad.messages if m.role == "tool"]
    tool_msgs[1].content = tool_msgs[1].content + "\nextra: 1"
    tool_msgs[1].rehearsed = True
    audit = replay_trajectory(bad, AuditOptions())
    assert [r["step"] for r in audit.steps if r["diverged"]] == [1]
    old = traj.model_copy(deep=True)
    old.env = {**old.env, "version": "v1"}
    env = AgentDojoEnv()
    replay_trajectory(old, AuditOptions(), env_cache={"agentdojo": env})
    assert env.version_loaded == "v1"


def test_baseline_references_run_on_agentdojo(real, tmp_path):
    train, dev = set(split_ids("train")), split_ids("dev")
    paths = {}
    for name, keep in (("train", train), ("dev", set(dev))):
        paths[name] = tmp_path / f"{name}.jsonl"
        with TrajectoryWriter(paths[name], mode="w") as w:
            for t in real:
                if t.task_id in keep:
                    w.write(t)
    out = tmp_path / "lookup"
    assert audit_main(["--quiet", "baseline", str(paths["dev"]), "--reference",
                       str(paths["train"]), "--model", "lookup", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["steps"] == sum(len(get_task(i).calls()) for i in dev)
    assert 0.5 < summary["scores"]["exact"]["mean"] < 1.0


def test_a_task_trajectory_is_its_ground_truth(tasks):
    task = tasks["travel/user_task_0"]
    traj = agentdojo_trajectory(task)
    steps = traj.tool_steps()
    assert [(s.tool, s.arguments) for s in steps] == task.calls()
    assert default_environment("v1.2.2", "travel") is not default_environment("v1.2.2", "travel")
