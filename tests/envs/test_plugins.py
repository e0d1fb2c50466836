"""Environment plugins: real installed distributions found through their entry points, the
docs' worked example end to end, a broken plugin that cannot break the built-ins, and the
MethodEnv helper's pure logic."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.core.envs.base import ToolKind, UnknownEnvironment, make_env
from envace.core.envs.family import FAMILIES
from envace.core.envs.methods import MethodEnv, tool

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "envace_counter_env"

BROKEN_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "envace-broken-env"
version = "0.0.1"

[project.entry-points."envace.environments"]
broken = "envace_broken_env:Env"
bfcl = "envace_broken_env:Env"

[tool.setuptools]
packages = ["envace_broken_env"]
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The example and a broken plugin, pip-installed (real metadata) into a target dir."""
    tmp = tmp_path_factory.mktemp("plugins")
    counter = tmp / "counter"
    shutil.copytree(EXAMPLE, counter, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    broken = tmp / "broken"
    (broken / "envace_broken_env").mkdir(parents=True)
    (broken / "pyproject.toml").write_text(BROKEN_PYPROJECT)
    (broken / "envace_broken_env" / "__init__.py").write_text(
        'raise ImportError("needs the frobnicate library")\n')
    target = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(counter), str(broken)],
                   check=True, capture_output=True)
    assert list(target.glob("envace_counter_env-0.1.0.dist-info/entry_points.txt"))
    return target


def _run(site: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=cwd or ROOT)


def test_worked_example_from_install_to_audited_file(site, tmp_path):
    """docs/plugins.md: envs lists it, export-real writes its tasks, the audit replays them."""
    listing = _run(site, "-m", "envace.cli", "envs", "counter")
    assert listing.returncode == 0, listing.stderr
    assert "plugin envace-counter-env 0.1.0 (envace_counter_env:CounterEnv)" in listing.stdout
    assert "tasks (3): visitors, new_counter, tidy_up" in listing.stdout
    assert "tools (4): get, increment, list_counters, remove" in listing.stdout
    out = tmp_path / "counter.jsonl"
    exported = _run(site, "-m", "envace.cli", "data", "export-real", "--env", "counter",
                    "--split", "all", "--out", str(out))
    assert exported.returncode == 0 and "wrote 3" in exported.stdout, exported.stderr
    first = json.loads(out.read_text().splitlines()[0])
    assert first["env"] == {"name": "counter", "task": "visitors"}
    assert [m["content"] for m in first["messages"] if m["role"] == "tool"] == [
        '{"visitors": 5}', '{"visitors": 5}']
    audit = _run(site, "-m", "audit.cli", "--quiet", "replay", str(out), "--out",
                 str(tmp_path / "audit"))
    assert audit.returncode == 0, audit.stderr
    summary = json.loads((tmp_path / "audit" / "summary.json").read_text())
    assert summary["counts"]["steps"] == 6 and summary["counts"]["diverged"] == 0
    # a rehearsed response that is wrong diverges at that step
    traj = json.loads(out.read_text().splitlines()[0])
    tool_msgs = [m for m in traj["messages"] if m["role"] == "tool"]
    tool_msgs[1].update(content='{"visitors": 4}', rehearsed=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(traj) + "\n")
    assert _run(site, "-m", "audit.cli", "--quiet", "replay", str(bad), "--out",
                str(tmp_path / "bad")).returncode == 0
    steps = [json.loads(x) for x in (tmp_path / "bad" / "steps.jsonl").read_text().splitlines()]
    assert [s["diverged"] for s in steps] == [False, True]
    assert [s["mutates_state"] for s in steps] == [True, False]  # observed while replaying


def test_a_broken_plugin_cannot_break_the_builtins(site):
    code = textwrap.dedent("""
        from envace.core.envs.base import PluginLoadError, env_names, make_env
        print(type(make_env("bfcl")).__name__, type(make_env("agentdojo")).__name__)
        print(env_names())
        try:
            make_env("broken")
        except PluginLoadError as exc:
            print("ERR", exc)
        print(type(make_env("counter")).__name__)
    """)
    res = _run(site, "-c", code)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "BFCLEnv AgentDojoEnv"  # the plugin named "bfcl" is ignored
    assert lines[1] == str([*FAMILIES, 'broken', 'counter'])  # the built-ins, then plugins
    assert lines[2].startswith("ERR environment plugin 'broken' (envace_broken_env:Env, from "
                               "envace-broken-env 0.0.1) failed to import: ImportError: needs "
                               "the frobnicate library")
    assert lines[3] == "CounterEnv"
    listing = _run(site, "-m", "envace.cli", "envs", "broken", "counter")
    assert listing.returncode == 3  # listed, but one environment did not load (issue 39)
    assert "error: environment plugin 'broken'" in listing.stdout
    assert "tasks (3)" in listing.stdout


def test_unknown_names_list_what_is_there():
    with pytest.raises(UnknownEnvironment, match="registered: bfcl, agentdojo"):
        make_env("no_such_env")


# -- MethodEnv (pure logic, in process) ---------------------------------------------------------
class Shop(MethodEnv):
    name = "shop"
    TASKS = {"one": {"state": {"stock": {"apple": 2}}, "prompt": "Buy an apple.",
                     "ground_truth": [["buy", {"item": "apple"}]]}}

    @tool
    def buy(self, item: str, qty: int = 1, note: str | None = None) -> dict:
        """Buy `qty` of `item`.

        Longer text that is not the description."""
        if self.stock.get(item, 0) < qty:
            raise ValueError(f"not enough {item}")
        self.stock[item] -= qty
        return {"left": self.stock[item]}

    @tool
    def look(self, item: str) -> int:
        """How many of `item` are left."""
        return self.stock.get(item, 0)

    def helper(self) -> None:  # not a tool
        raise AssertionError("never offered")


def test_method_env_schemas_and_calls():
    env = Shop()
    env.reset("one")
    schemas = {s["function"]["name"]: s["function"] for s in env.tools()}
    assert set(schemas) == {"buy", "look"}
    assert schemas["buy"]["description"] == "Buy `qty` of `item`."
    assert schemas["buy"]["parameters"] == {"type": "object", "properties": {
        "item": {"type": "string"}, "qty": {"type": "integer"}, "note": {"type": "string"}},
        "required": ["item"]}
    assert env.execute("look", {"item": "apple"}).content == "2"
    assert env.tool_kind("buy") is None  # not observed yet
    assert env.execute("buy", {"item": "apple", "qty": 2}).content == '{"left": 0}'
    assert env.tool_kind("buy") == ToolKind.WRITE and env.tool_kind("look") == ToolKind.READ
    assert env.state() == {"stock": {"apple": 0}}
    for args, expect in [({"item": "apple"}, "ValueError: not enough apple"),
                         ({"item": "apple", "colour": "red"}, "unexpected argument(s) colour"),
                         ({}, "missing argument(s) item"),
                         ({"item": "apple", "qty": "2"}, "qty must be integer"),
                         ({"item": "apple", "qty": True}, "qty must be integer")]:
        r = env.execute("buy", args)
        assert r.error and expect in r.content, (args, r)
    assert env.execute("helper", {}).error and env.execute("buy", None).error
    env.reset({"stock": {"pear": 1}})
    assert env.state() == {"stock": {"pear": 1}}
    assert env.ground_truth("one") == [("buy", {"item": "apple"})]
    with pytest.raises(KeyError, match="unknown shop task 'two'"):
        env.reset("two")


@settings(max_examples=200, deadline=None)
@given(tool_name=st.sampled_from(["buy", "look", "helper", "", "reset", "state"]),
       args=st.one_of(st.none(), st.lists(st.integers()), st.dictionaries(
           st.sampled_from(["item", "qty", "note", "x"]),
           st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5),
                     st.lists(st.integers(), max_size=2)), max_size=4)))
def test_method_env_never_raises_on_any_call(tool_name, args):
    env = Shop()
    env.reset("one")
    r = env.execute(tool_name, args)
    assert isinstance(r.content, str) and isinstance(r.error, bool)
    assert tool_name in ("buy", "look") or r.error
