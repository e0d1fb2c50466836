"""The environment-family contract (envace/core/envs/README.md), run over every family.

Parametrised over ``envace.core.envs.family.FAMILIES`` and an MCP server profile (``mcp:ledger``,
the SDK-free server of tests/envs/mcp; and, for the protocol part, over every installed plugin
environment), so a new family gets these tests for free. Each uses a few tasks of
a split, to keep the suite small; the full ground-truth replays live in each family's own tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from envace.core.envs.base import ToolKind, make_env, plugin_entry_points
from envace.core.envs.family import FAMILIES, family
from envace.core.export import export_real
from envace.core.schema import Trajectory, TrajectoryWriter

ROOT = Path(__file__).resolve().parents[2]
N_TASKS = 3  # dev tasks per family in each test
# installed plugins (entry points), not environments another test registered in this process
PLUGINS = sorted(plugin_entry_points())
# An MCP server profile is a family made from the user's config and task file: the contract runs
# over the SDK-free ledger server of tests/envs/mcp (its tasks have train/dev/test splits).
MCP_DIR = ROOT / "tests" / "envs" / "mcp"
MCP_ENV = {"ENVACE_MCP_CONFIG": str(MCP_DIR / "servers.yaml"),
           "ENVACE_MCP_TASKS": str(MCP_DIR / "tasks" / "ledger.jsonl")}
NAMES = [*FAMILIES, "mcp:ledger"]


@pytest.fixture(scope="module", autouse=True)
def _mcp_profile():
    with pytest.MonkeyPatch.context() as mp:
        for key, value in MCP_ENV.items():
            mp.setenv(key, value)
        yield


def _dev(name: str, n: int = N_TASKS) -> list[Any]:
    return family(name).split_tasks("dev", "task")[:n]


@pytest.fixture(scope="module", params=NAMES)
def fam_real(request, tmp_path_factory) -> tuple[str, list[Any], list[Trajectory], Path]:
    """A family, a few dev tasks, their real trajectories and the file holding them."""
    name = request.param
    tasks = _dev(name)
    trajs = list(export_real(tasks))
    path = tmp_path_factory.mktemp(f"real-{name}") / "dev.jsonl"
    with TrajectoryWriter(path, mode="w") as w:
        for t in trajs:
            w.write(t)
    return name, tasks, trajs, path


def _steps(d: Path) -> list[dict]:
    return [json.loads(line) for line in (d / "steps.jsonl").read_text().splitlines()]


def calls_per_turn(traj: Trajectory) -> tuple[list[list[tuple[str, dict]]], str]:
    """A real trajectory's calls per user turn (a turn ends at an assistant message without
    calls) and its last assistant text."""
    turns: list[list[tuple[str, dict]]] = [[]]
    final = ""
    for m in traj.messages:
        if m.role != "assistant":
            continue
        if m.tool_calls:
            turns[-1].extend((c.function.name, dict(c.function.arguments)) for c in m.tool_calls)
        else:
            final = m.content or ""
            turns.append([])
    return (turns[:-1] if not turns[-1] else turns), final


# ------------------------------------------------------------------ 1. ground truth replays clean
def test_ground_truth_replays_with_zero_divergence(fam_real, tmp_path):
    name, tasks, trajs, path = fam_real
    s = run_audit([str(path)], tmp_path / "a", AuditOptions(progress=False, plots=False))
    assert s["counts"]["trajectories"] == len(tasks) and s["counts"]["skipped"] == 0
    assert s["counts"]["steps"] == sum(len(t.tool_steps()) for t in trajs) > 0
    assert s["counts"]["diverged"] == 0
    assert all(t.source == "real" for t in trajs)
    assert all(not st.response.rehearsed for t in trajs for st in t.tool_steps())


# ------------------------------------------------------------------ 2. determinism across processes
@pytest.mark.parametrize("name", NAMES)
def test_exports_in_fresh_processes_are_byte_identical(name, tmp_path):
    code = ("import sys; from envace.core.envs.family import family; "
            "from envace.core.export import export_real; "
            f"ts = family({name!r}).split_tasks('dev', 'task')[:2]; "
            "sys.stdout.write('\\n'.join(t.to_json() for t in export_real(ts)))")
    runs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                           check=True, env={"PYTHONHASHSEED": str(seed), "PATH": "/usr/bin",
                                            "PYTHONPATH": str(ROOT), **MCP_ENV}).stdout
            for seed in (1, 2)]
    assert runs[0] and runs[0] == runs[1]


# ------------------------------------------------------------------ 3. planted errors are found
def test_planted_errors_diverge_exactly_where_planted(fam_real, tmp_path):
    name, _, trajs, _ = fam_real
    planted: set[tuple[str, int]] = set()
    altered = [t.model_copy(deep=True) for t in trajs]
    for k, t in enumerate(altered):
        for st in t.tool_steps()[k % 2::2]:
            st.response.content = json.dumps({"planted": f"wrong {name} {st.step}"})
            st.response.rehearsed = True
            planted.add((t.id, st.step))
    path = tmp_path / "planted.jsonl"
    with TrajectoryWriter(path, mode="w") as w:
        for t in altered:
            w.write(t)
    s = run_audit([str(path)], tmp_path / "a", AuditOptions(progress=False, plots=False))
    got = {(r["trajectory_id"], r["step"]) for r in _steps(tmp_path / "a") if r["diverged"]}
    assert planted and got == planted
    assert s["by_source"]["real"]["diverged"] == 0


# ------------------------------------------------------------------ 4. bad calls are errors
def _bad_calls(env: Any) -> None:
    schemas = env.tools()
    assert schemas, "a task offers at least one tool"
    fn = next((s["function"] for s in schemas if s["function"]["parameters"].get("required")),
              schemas[0]["function"])
    results = {
        "unknown tool": env.execute("no_such_tool_zz", {}),
        "unknown argument": env.execute(fn["name"], {"zz_not_an_argument": 1}),
    }
    if fn["parameters"].get("required"):
        results["missing argument"] = env.execute(fn["name"], {})
    for why, r in results.items():
        assert r.error, f"{why}: {fn['name']} answered {r.content[:200]!r} without error"
        assert isinstance(r.content, str) and r.content


@pytest.mark.parametrize("name", NAMES)
def test_bad_calls_are_answered_as_errors(name):
    task = _dev(name, 1)[0]
    env = family(name).new_env(task)
    env.reset(task)
    _bad_calls(env)


@pytest.mark.parametrize("name", PLUGINS or [pytest.param("none", marks=pytest.mark.skip(
    reason="no environment plugin installed in this interpreter"))])
def test_plugin_bad_calls_are_answered_as_errors(name):
    env = make_env(name)
    env.reset(env.task_ids()[0] if hasattr(env, "task_ids") else {})
    _bad_calls(env)


# ------------------------------------------------------------------ 5. the record holds together
@pytest.mark.parametrize("name", NAMES)
def test_splits_are_disjoint_and_units_defined(name):
    fam = family(name)
    ids = {s: {t.id for t in fam.split_tasks(s, "task")} for s in fam.splits}
    assert all(ids.values())
    for a in fam.splits:
        for b in fam.splits:
            assert a == b or not ids[a] & ids[b], (a, b)
    units = {s: {fam.cluster_id(i) for i in v} for s, v in ids.items()}
    assert all(len(units[s]) <= len(ids[s]) for s in fam.splits)
    # a resampling unit never straddles two splits (held-out data stays held out)
    for a in fam.splits:
        for b in fam.splits:
            assert a == b or not units[a] & units[b], (a, b)
    assert fam.resampling_unit


@pytest.mark.parametrize("name", NAMES)
def test_tools_have_schemas_and_kinds_and_resets_repeat(name):
    fam = family(name)
    for task in _dev(name):
        env = fam.new_env(task)
        env.reset(task)
        first = env.state_hash()
        for s in env.tools():
            assert s["type"] == "function" and s["function"]["name"]
            assert s["function"]["parameters"]["type"] == "object"
            assert env.tool_kind(s["function"]["name"]) in (ToolKind.READ, ToolKind.WRITE)
        env.reset(task)
        assert env.state_hash() == first and len(first) == 16


def test_verifier_passes_ground_truth_and_fails_without_its_last_write(fam_real):
    name, tasks, trajs, _ = fam_real
    fam = family(name)
    with_writes = 0
    for task, traj in zip(tasks, trajs, strict=True):
        turns, final = calls_per_turn(traj)
        assert fam.reward("state", task, turns, final)["reward"] == 1.0, task.id
        env = fam.new_env(task)
        env.reset(task)
        writes = [(t, i) for t, calls in enumerate(turns) for i, (tool, _) in enumerate(calls)
                  if env.tool_kind(tool) == ToolKind.WRITE]
        if not writes:
            continue
        t, i = writes[-1]
        cut = [list(c) for c in turns]
        del cut[t][i]
        with_writes += 1
        assert fam.reward("state", task, cut, final)["reward"] < 1.0, (task.id, writes[-1])
    assert with_writes, "the sampled tasks should include one with a write call"


# ------------------------------------------------------------------ 6. the per-call limit
STALL = "__contract_stall__"  # a tool a planted stall answers, for the Python families
# the limit covers every call to the environment's process, its resets too: a τ² reset (the
# domain's databases loaded) ran past 1.5 s on the two cores at load 4-5 (2026-12-06)
LIMIT_S = 5.0


def test_a_call_past_the_limit_is_a_timeout_and_the_environment_goes_on(fam_real, monkeypatch):
    """Every family under the call limits (``envace.core.envs.guard``; an MCP server: its own
    request timeout): a call that does not answer is cut at the limit and answered as an error
    marked ``timeout``, never a stall, and the environment answers its real calls afterwards
    as it did before (Python families: the same call in the restored child; an MCP profile,
    whose server is stopped after a hung call: after the next reset)."""
    import time

    from envace.core.envs.limits import CallLimits
    from envace.core.envs.task_envs import close_env, task_environment

    name, tasks, trajs, _ = fam_real
    task, traj = tasks[0], trajs[0]
    first = traj.tool_steps()[0]
    call = (first.tool, dict(first.arguments or {}))
    mcp = name.startswith("mcp:")
    if not mcp:  # planted in the parent before the environment's child is forked from it
        cls = type(family(name).new_env(task))
        real = cls.execute

        def stalling(self, tool, arguments):
            if tool == STALL:
                time.sleep(120)
            return real(self, tool, arguments)

        monkeypatch.setattr(cls, "execute", stalling)
    env = task_environment(task, CallLimits(LIMIT_S, None))
    try:
        t0 = time.monotonic()
        r = env.execute("hang" if mcp else STALL, {})
        assert time.monotonic() - t0 < LIMIT_S + 10, name
        assert r.error and getattr(r, "timeout", False) is True, (name, r.content[:200])
        if mcp:
            env.reset(task)
        after = env.execute(*call)
        assert after.content == first.response.content, name
    finally:
        close_env(env)
        if mcp:
            env.close()
