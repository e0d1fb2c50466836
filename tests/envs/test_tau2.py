"""The τ² family beyond the contract: tau2's own responses, evaluators, splits and hazards.

The contract (tests/envs/test_contract.py) already runs over ``tau2`` on three dev tasks. Here:
every ground-truth call answered as tau2's own ``get_response`` answers it (on environments that
tau2 builds itself from its files), the verifier's 1.0 on the ground truth and below 1 on altered
call lists, telecom's frozen bill ids, the split rule, and the hazards (an unknown argument; the
``calculate`` power tower, which needs the per-call limit of issue 39).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from envace.core.envs.base import ToolKind, make_env
from envace.core.envs.tau2 import domain as D
from envace.core.envs.tau2 import tasks as T
from envace.core.envs.tau2.domain import restorers
from envace.core.envs.tau2.env import TAU2Env, tool_call
from envace.core.envs.tau2.verify import check_calls

ROOT = Path(__file__).resolve().parents[2]


def _tau2_file(rel: str) -> Path:
    import tau2

    return Path(tau2.__file__).parent / rel


# ------------------------------------------------------------------ the data as tau2 has it
def test_sizes_and_prompts_are_tau2s():
    sizes = {d: (len(T.load_tasks(d)), sum(len(t.calls()) for t in T.load_tasks(d).values()))
             for d in D.DOMAINS}
    assert sizes == {"airline": (50, 148), "retail": (114, 553), "telecom": (114, 516)}
    assert len(T.load_tasks(D.FULL_DOMAIN)) == 2285
    base = {t.tau2_id for t in T.load_tasks("telecom").values()}
    assert base <= {t.tau2_id for t in T.load_tasks(D.FULL_DOMAIN).values()}
    # the prompt constants are tau2's (its agent module imports litellm, so they are copied)
    tree = ast.parse(_tau2_file("agent/llm_agent.py").read_text())
    consts = {n.targets[0].id: n.value for n in tree.body if isinstance(n, ast.Assign)
              and isinstance(n.targets[0], ast.Name)}
    for name in ("AGENT_INSTRUCTION", "SYSTEM_PROMPT", "AGENT_SOLO_INSTRUCTION"):
        node = consts[name]  # """...""".strip()
        assert isinstance(node, ast.Call) and node.func.attr == "strip"
        assert getattr(T, name) == node.func.value.value.strip(), name
    assert T.SOLO_STOP in T.AGENT_SOLO_INSTRUCTION
    airline = T.get_task("airline/0")
    assert airline.turns[0][0]["role"] == "system" and "<policy>" in airline.turns[0][0]["content"]
    assert airline.prompt == str(airline.tau2_task().user_scenario)
    tele = next(iter(T.load_tasks("telecom").values()))
    assert tele.prompt == tele.tau2_task().ticket and tele.solo
    assert "`done`" not in tele.turns[0][0]["content"]


def test_committed_splits_follow_the_rule_and_keep_tau2s_test():
    carved = T.carve_splits()
    assert {s: T.split_ids(s) for s in T.SPLITS} == carved
    for d in D.DOMAINS:
        mine = {s: {i.split("/", 1)[1] for i in carved[s] if i.startswith(d + "/")}
                for s in T.SPLITS}
        theirs = T.tau2_splits(d)
        assert mine["test"] == set(theirs["test"])
        assert mine["train"] | mine["dev"] == set(theirs["train"])
        assert not mine["train"] & mine["dev"]
        assert len(mine["dev"]) == int(T.DEV_SHARE * len(theirs["train"]) + 0.5)
    assert [len(carved[s]) for s in T.SPLITS] == [132, 46, 100]
    with pytest.raises(ValueError, match="no splits"):
        T.split_ids("train", D.FULL_DOMAIN)


# ------------------------------------------------------------------ every response is tau2's
@cache
def _raw_db(domain: str) -> tuple[bytes, bytes | None]:
    """The domain's databases as tau2 reads them from its files (validated per task below)."""
    from tau2.utils import load_file

    mod = D.domain_module(domain)
    pkg = sys.modules[mod.__name__.rsplit(".", 1)[0] + ".utils"]
    prefix = "TELECOM" if domain in D.SOLO else domain.upper()
    db = json.dumps(load_file(getattr(pkg, f"{prefix}_DB_PATH"))).encode()
    user_path = getattr(pkg, f"{prefix}_USER_DB_PATH", None)
    return db, (json.dumps(load_file(user_path)).encode() if user_path else None)


def _tau2_reference(domain: str, task: T.TAU2Task) -> Any:
    """tau2's own environment for the task: its get_environment on databases validated from its
    files (as its ``DB.load`` does), the initial state applied by its set_state."""
    db_cls, user_cls = (type(r.pristine) if r else None for r in restorers(domain))
    raw, raw_user = _raw_db(domain)
    mod = D.domain_module(domain)
    kw: dict[str, Any] = {"db": db_cls.model_validate_json(raw)}
    if raw_user is not None:
        kw.update(user_db=user_cls.model_validate_json(raw_user), solo_mode=True)
    env = mod.get_environment(**kw)
    init = task.tau2_task().initial_state
    env.set_state(init.initialization_data if init else None,
                  init.initialization_actions if init else None, [])
    return env


@pytest.mark.parametrize("domain", D.DOMAINS)
def test_every_ground_truth_call_answers_as_tau2s_get_response(domain):
    from envace.core.envs.tau2.env import ids_from

    env = TAU2Env()
    n = errors = 0
    for task in T.load_tasks(domain).values():
        env.reset(task)
        source = type(env.ids)()  # the same seeded ids as the adapter's reset
        with ids_from(source):
            ref = _tau2_reference(domain, task)
        for k, (name, args) in enumerate(task.calls()):
            mine = env.execute(name, args)
            with ids_from(source):
                theirs = ref.get_response(tool_call(f"c{k}", name, args))
            assert (mine.content, mine.error) == (theirs.content, theirs.error), (task.id, k)
            n += 1
            errors += mine.error
    assert n == {"airline": 148, "retail": 553, "telecom": 516}[domain]
    if domain == "retail":
        assert errors == 23  # retail's ground truth fails on purpose this often


# ------------------------------------------------------------------ the verifier
def _last_write(task: T.TAU2Task, env: TAU2Env) -> int | None:
    """Index of the last ground-truth write whose response was not an error."""
    env.reset(task)
    last = None
    for i, (name, args) in enumerate(task.calls()):
        r = env.execute(name, args)
        if env.tool_kind(name) == ToolKind.WRITE and not r.error:
            last = i
    return last


def _verifier_cases(tasks: list[T.TAU2Task]) -> None:
    env = TAU2Env()
    cut = 0
    for task in tasks:
        calls = task.calls()
        ok = check_calls(task, calls, task.final_text, env)
        assert ok.reward == 1.0 and ok.valid, (task.id, ok.detail)
        i = _last_write(task, env)
        if i is not None:
            assert check_calls(task, [], "", env).reward < 1.0, task.id
            cut += 1
            dropped = check_calls(task, calls[:i] + calls[i + 1:], task.final_text, env)
            assert dropped.reward < 1.0, (task.id, calls[i][0])
        if task.final_text:
            assert check_calls(task, calls, "", env).reward < 1.0, task.id
    assert cut


def test_verifier_is_tau2s_on_a_sample_of_each_domain():
    sample = [t for d in D.DOMAINS for t in list(T.load_tasks(d).values())[:3]]
    _verifier_cases(sample)
    with_comm = next(t for t in T.load_tasks("retail").values() if t.final_text)
    _verifier_cases([with_comm])


@pytest.mark.slow
@pytest.mark.parametrize("domain", D.DOMAINS)
def test_verifier_passes_every_ground_truth_and_fails_altered_lists(domain):
    _verifier_cases(list(T.load_tasks(domain).values()))


def test_reward_kinds():
    from envace.core.envs.family import family

    task = T.get_task("retail/0")
    fam = family("tau2")
    calls = task.calls()
    assert fam.reward("state", task, [calls], task.final_text)["success"]
    assert fam.reward("action", task, [calls], "")["reward"] == 1.0
    assert fam.reward("action_partial", task, [[]], "")["reward"] == 0.0
    out = fam.reward("state", task, [[("no_such_tool", {}), (7, "x")]], "")
    assert out["reward"] == 0.0 and not out["success"] and "cannot hold" in out["detail"]


# ------------------------------------------------------------------ resets, ids, kinds
def test_reset_puts_databases_back_as_tau2_loads_them():
    env = TAU2Env()
    for tid in ("airline/2", "retail/3", "telecom/" + next(iter(T.load_tasks("telecom")))
                .split("/", 1)[1]):
        task = T.get_task(tid)
        env.reset(task)
        before = env.state_hash()
        for name, args in task.calls():
            env.execute(name, args)
        assert env.state_hash() != before, tid  # the ground truth writes
        env.reset(task)
        assert env.state_hash() == before, tid
        ref = _tau2_reference(task.domain, task)
        assert env.environment.get_db_hash() == ref.get_db_hash()
        assert env.environment.get_user_db_hash() == ref.get_user_db_hash()
    assert restorers("airline")[0].restored >= 1


def test_telecom_bill_ids_are_frozen_per_reset():
    # C1002 has no draft bill, so a refuel makes one: bill id B{uuid4().hex[:8]} in tau2
    task = next(iter(T.load_tasks("telecom").values()))
    call = ("refuel_data", {"customer_id": "C1002", "line_id": "L1004", "gb_amount": 1.0})
    hashes, bills = set(), set()
    for env in (TAU2Env(), TAU2Env()):
        for _ in range(2):  # a fresh adapter and a reset one
            env.reset(task)
            assert not env.execute(*call).error
            hashes.add(env.state_hash())
            bills.add(tuple(b["bill_id"] for b in env.state()["db"]["bills"]))
    assert len(hashes) == 1 and len(bills) == 1
    new = [b for b in next(iter(bills)) if b.startswith("B") and len(b) == 9]
    assert len(new) == 1, bills
    import uuid

    tools = D.tau2_module("tau2.domains.telecom.tools")
    assert tools.uuid.uuid4() != tools.uuid.uuid4()  # outside the adapter: real uuid4
    assert isinstance(tools.uuid.uuid4(), uuid.UUID)


def test_tool_kinds_are_tau2s_and_reads_change_nothing():
    env = TAU2Env()
    kinds = {}
    for d in D.DOMAINS:
        env.reset(next(iter(T.load_tasks(d).values())))
        for s in env.tools():
            kinds[(d, s["function"]["name"])] = env.tool_kind(s["function"]["name"])
    assert kinds[("airline", "book_reservation")] == ToolKind.WRITE
    assert kinds[("airline", "calculate")] == ToolKind.READ  # GENERIC
    assert kinds[("retail", "transfer_to_human_agents")] == ToolKind.READ  # GENERIC
    assert kinds[("telecom", "toggle_airplane_mode")] == ToolKind.WRITE  # a user tool (solo)
    for task in T.split_tasks("dev", "telecom")[:6]:  # telecom: small databases
        env.reset(task)
        for name, args in task.calls():
            before = env.state_hash()
            env.execute(name, args)
            if env.tool_kind(name) == ToolKind.READ:
                assert env.state_hash() == before, (task.id, name)


def test_inline_state_reset():
    env = make_env("tau2")
    env.reset("retail/1")
    state = env.state()
    other = make_env("tau2")
    other.reset({"domain": "retail", "db": state["db"]})
    assert other.state_hash() == env.state_hash()
    with pytest.raises(ValueError, match="domain"):
        other.reset({"db": {}})


# ------------------------------------------------------------------ hazards
def test_bad_calls_answer_tau2s_error_naming_the_argument():
    env = make_env("tau2")
    env.reset("airline/0")
    r = env.execute("get_user_details", {"user_id": "raj_sanchez_7340", "zz_bogus": 1})
    assert r.error and "zz_bogus" in r.content and r.content.startswith("Error: ")
    r = env.execute("get_user_details", {})
    assert r.error and "user_id" in r.content
    r = env.execute("no_such_tool", {})
    assert r.error and "no_such_tool" in r.content
    for args in (["x"], {1: "x"}, "user_id=1"):
        assert env.execute("get_user_details", args).error
    assert env.execute("calculate", {"expression": "2 + 2"}).content == "4.0"
    assert env.execute("calculate", {"expression": "__import__('os')"}).error


GUARDED = """
import json, sys
from envace.core.envs.guard import guarded_env
from envace.core.envs.limits import CallLimits
env = guarded_env("tau2", CallLimits(call_timeout_s=20))  # a first reset takes seconds
env.reset("airline/0")
r = env.execute("calculate", {"expression": "9**9**9"})
ok = env.execute("calculate", {"expression": "2 + 2"})
print(json.dumps([r.error, getattr(r, "timeout", None), r.content, ok.content]))
"""


def test_calculate_power_tower_is_cut_by_the_call_limit():
    # in a child process with a hard timeout: without the limit the call would never return
    try:
        out = subprocess.run([sys.executable, "-c", GUARDED], cwd=ROOT, capture_output=True,
                             text=True, timeout=180, env={"PATH": "/usr/bin",
                                                         "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        pytest.fail("calculate('9**9**9') was not cut within 180 s")
    assert out.returncode == 0, out.stderr[-500:]
    error, timeout, content, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert error and timeout, content
    assert after == "4.0"  # the environment is usable after the cut
