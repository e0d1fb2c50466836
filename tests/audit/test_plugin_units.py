"""A plugin's own resampling unit, and an MCP task file's clusters, reach the audit (issue 38).

The plugin is registered in process (``register_env``, a real MethodEnv replayed by the real
``envace-audit replay``); the plugin that cannot load is a real entry point whose module is
not installed; the MCP declaration is read from a real task file.
"""

from __future__ import annotations

import json
from importlib.metadata import EntryPoint

import pytest

from audit.cli import main as audit_main
from audit.stats.clusters import assign_clusters, resolve
from envace.core.envs import base
from envace.core.envs.declared import declared_unit
from envace.core.envs.mcp.tasks import parse_task
from envace.core.envs.methods import MethodEnv, tool
from envace.core.export import plugin_trajectory

NAME = "envace_test_grouped_counter"


class GroupedCounter(MethodEnv):
    """Tasks ``<group>-<n>``: the tasks of one group share their state, so they are one unit."""

    name = NAME
    resampling_unit = "group"
    TASKS = {
        tid: {"state": {"value": v}, "prompt": f"Add one ({tid}).",
              "ground_truth": [["add", {}], ["add", {}]]}
        for tid, v in (("a-1", 0), ("a-2", 0), ("a-3", 0), ("b-1", 5), ("b-2", 5))
    }

    @staticmethod
    def cluster_of(task_id: str) -> str:
        return "group:" + task_id.split("-")[0]

    def setup(self, state: dict) -> None:
        self.value = int(state.get("value", 0))

    @tool(writes=True)
    def add(self) -> dict:
        """Add one to the value."""
        self.value += 1
        return {"value": self.value}


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(base._REGISTRY, NAME, GroupedCounter)
    return GroupedCounter


def _trajectories(path) -> None:
    env = GroupedCounter()
    lines = []
    for tid in GroupedCounter.TASKS:
        traj = json.loads(plugin_trajectory(env, NAME, tid).to_json())
        tool_msgs = [m for m in traj["messages"] if m["role"] == "tool"]
        tool_msgs[-1].update(rehearsed=True)
        if tid.startswith("a"):  # group a's world model is wrong on the second call
            tool_msgs[-1].update(content='{"value": 9}')
        lines.append(json.dumps(traj))
    path.write_text("\n".join(lines) + "\n")


def test_replay_clusters_by_the_plugins_declared_unit(registered, tmp_path):
    src = tmp_path / "t.jsonl"
    _trajectories(src)
    assert audit_main(["--quiet", "replay", str(src), "--out", str(tmp_path / "a")]) == 0
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["resampling_unit"] == s["interval"]["resampling_unit"] == "group"
    assert s["interval"]["clusters"] == 2  # five tasks, two groups
    assert "registered in process" in s["interval"]["unit_declared_by"]
    assert "resampling_unit_note" not in s
    steps = [json.loads(x) for x in (tmp_path / "a" / "steps.jsonl").read_text().splitlines()]
    assert {r["env_name"] for r in steps} == {NAME}
    # --cluster-by still overrides the declaration
    assert audit_main(["--quiet", "replay", str(src), "--out", str(tmp_path / "b"),
                       "--cluster-by", "task"]) == 0
    s = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert (s["resampling_unit"], s["interval"]["clusters"]) == ("task", 5)


def test_rescore_without_the_plugin_falls_back_to_the_task_and_says_so(registered, tmp_path,
                                                                         monkeypatch):
    src = tmp_path / "t.jsonl"
    _trajectories(src)
    assert audit_main(["--quiet", "replay", str(src), "--out", str(tmp_path / "a")]) == 0
    monkeypatch.delitem(base._REGISTRY, NAME)  # the plugin is gone when the audit is rescored
    assert audit_main(["--quiet", "rescore", str(tmp_path / "a"), "--out",
                       str(tmp_path / "r")]) == 0
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert (s["resampling_unit"], s["interval"]["clusters"]) == ("task", 5)
    assert "not registered or installed" in s["resampling_unit_note"]
    assert s["interval"]["unit_note"] == s["resampling_unit_note"]


def test_a_plugin_that_cannot_load_falls_back_to_the_task(monkeypatch):
    ep = EntryPoint(name="ghost", value="envace_no_such_module_xyz:Env",
                    group="envace.environments")
    monkeypatch.setattr(base, "plugin_entry_points", lambda: {"ghost": ep})
    d = declared_unit("ghost")
    assert (d.unit, d.cluster_of) == ("task", None)
    assert "failed to import" in d.note and "clustered by the task" in d.note
    rows = [{"trajectory_id": f"t{i}", "task_id": f"x-{i}", "env_name": "ghost"} for i in range(3)]
    r = resolve(rows, None)
    assert (r.unit, r.note) == ("task", d.note)


def test_a_declared_unit_without_cluster_of_and_a_failing_cluster_of(monkeypatch):
    class NoMap(GroupedCounter):
        cluster_of = None  # type: ignore[assignment]

    class Raises(GroupedCounter):
        @staticmethod
        def cluster_of(task_id: str) -> str:
            if task_id == "bad":
                raise KeyError(task_id)
            return "g"

    monkeypatch.setitem(base._REGISTRY, "nomap", NoMap)
    monkeypatch.setitem(base._REGISTRY, "raises", Raises)
    d = declared_unit("nomap")
    assert d.unit == "task" and "without cluster_of" in d.note
    d = declared_unit("raises")
    assert d.unit == "group" and d.cluster_of("ok") == "g" and d.cluster_of("bad") == "task:bad"


MCP_TASKS = [
    {"id": "rent-1", "prompt": "p", "cluster": "rent"},
    {"id": "rent-2", "prompt": "p", "cluster": "rent"},
    {"id": "food-1", "prompt": "p", "cluster": "food"},
    {"id": "lone", "prompt": "p"},
]


def test_mcp_task_file_clusters(tmp_path, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in MCP_TASKS) + "\n")
    monkeypatch.setenv("ENVACE_MCP_TASKS", str(path))
    rows = [{"trajectory_id": f"tr-{t['id']}-{k}", "task_id": t["id"], "env_name": "mcp:ledger"}
            for t in MCP_TASKS for k in range(2)]
    r = resolve(rows, None)
    assert r.unit == "cluster" and str(path) in r.source and r.note is None
    assign_clusters(rows, r.unit, r.cluster_of)
    assert sorted({row["cluster"] for row in rows}) == ["food", "rent", "task:lone"]
    # a task file without clusters: the task; no task file: the task, and the note says why
    path.write_text(json.dumps({"id": "lone", "prompt": "p"}) + "\n")
    assert resolve(rows, None).unit == "task"
    monkeypatch.delenv("ENVACE_MCP_TASKS")
    r = resolve(rows, None)
    assert r.unit == "task" and "ENVACE_MCP_TASKS" in r.note


def test_mcp_cluster_field_is_checked():
    assert parse_task({"id": "a", "cluster": "g"}, "mcp:x").cluster == "g"
    for bad in (3, "", ["g"]):
        with pytest.raises(ValueError, match="'cluster'"):
            parse_task({"id": "a", "cluster": bad}, "mcp:x")
