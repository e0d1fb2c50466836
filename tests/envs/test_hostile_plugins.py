"""Issue #39: a plugin cannot make a command lie, and hostile names stay data.

Real distributions on a path (a ``*.dist-info`` with ``entry_points.txt``, found by
``importlib.metadata`` as pip's would be): a module that calls ``sys.exit(0)`` on import, one
that raises KeyboardInterrupt on import, one whose ``setup()`` raises for one task, and one
whose tool names carry ANSI/OSC escapes, HTML, Markdown, ``|`` and a newline. Each command runs
as a process, as a user runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envace.core.text import markdown_safe, terminal_safe

ROOT = Path(__file__).resolve().parents[2]
OSC = "\x1b]8;;http://evil.example/\x07click\x1b]8;;\x07"
HOSTILE_TOOLS = ["red\x1b[31mX", f"osc{OSC}", "<img src=http://evil.example/p.png>",
                 "![](http://evil.example/p.png)", "pipe|cell", "new\nline"]

PLUGINS = {
    "exits": "import sys\nsys.exit(0)\n",
    "interrupts": "raise KeyboardInterrupt\n",
    "setupfails": '''
from envace.core.envs.methods import MethodEnv, tool


class Env(MethodEnv):
    name = "setupfails"
    TASKS = {"good": {"state": {"n": 1}, "prompt": "p", "ground_truth": [["get", {}]]},
             "bad": {"state": {"n": -1}, "prompt": "p", "ground_truth": [["get", {}]]}}

    def setup(self, state):
        if state["n"] < 0:
            raise RuntimeError("setup refuses this task")
        self.n = state["n"]

    @tool
    def get(self) -> dict:
        """The number."""
        return {"n": self.n}
''',
    "listhangs": '''
import time


class Env:
    name = "listhangs"

    def task_ids(self):
        while True:  # a listing that never ends
            time.sleep(1)
''',
    "hostile": f'''
from envace.core.envs.base import ToolResult


class Env:
    name = "hostile"
    TOOLS = {HOSTILE_TOOLS!r}

    def reset(self, task):
        pass

    def tools(self):
        return [{{"type": "function", "function": {{"name": n, "parameters": {{}}}}}}
                for n in self.TOOLS]

    all_tools = tools

    def task_ids(self):
        return ["t"]

    def execute(self, tool, arguments):
        return ToolResult("ok")

    def state(self):
        return {{}}

    def state_hash(self):
        return "0"

    def tool_kind(self, tool):
        return None
''',
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hostile_site")
    for name, code in PLUGINS.items():
        mod = f"envace_{name}_env"
        (d / f"{mod}.py").write_text(code)
        info = d / f"envace_{name}_env-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: envace-{name}-env\n"
                                       "Version: 0.1\n")
        (info / "entry_points.txt").write_text(f"[envace.environments]\n{name} = {mod}:Env\n")
    return d


def run(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


def test_envs_lists_every_plugin_and_says_which_failed(site):
    """Before: the listing stopped after the built-ins with rc 0 (sys.exit on import)."""
    r = run(site, "-m", "envace.cli", "envs", "exits", "interrupts", "setupfails")
    assert r.returncode == 3, r.stderr  # listed, but some environment did not load
    assert "error: environment plugin 'exits'" in r.stdout and "SystemExit" in r.stdout
    assert "error: environment plugin 'interrupts'" in r.stdout
    assert "KeyboardInterrupt" in r.stdout
    assert "tasks (2): good, bad" in r.stdout  # the listing went on after them
    assert "Traceback" not in r.stderr


def _record(env: str, task: str, tool: str = "get") -> str:
    return json.dumps({
        "schema": "envace.trajectory/1", "id": f"{env}-{task}-{tool[:3]}", "task_id": task,
        "env": {"name": env, "task": task}, "source": "rehearsed", "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": tool, "arguments": {}}}]},
            {"role": "tool", "tool_call_id": "c0", "name": tool, "content": "x",
             "rehearsed": True}]}) + "\n"


def test_replay_of_a_record_naming_an_exiting_plugin_skips_it(site, tmp_path):
    """Before: exit 0, nothing written, no message."""
    src = tmp_path / "in.jsonl"
    src.write_text(_record("exits", "t") + _record("interrupts", "t")
                   + _record("setupfails", "good") + _record("setupfails", "bad"))
    r = run(site, "-m", "audit.cli", "--quiet", "replay", str(src), "--out", str(tmp_path / "o"))
    assert r.returncode == 3, r.stderr
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["counts"]["trajectories"] == 1 and s["counts"]["skipped"] == 3
    reasons = " ".join(x["reason"] for x in s["skipped_records"])
    assert "SystemExit" in reasons and "KeyboardInterrupt" in reasons
    assert "setup refuses this task" in reasons


@pytest.mark.parametrize("name", ["exits", "interrupts"])
def test_export_real_of_a_plugin_that_exits_on_import_is_exit_2(site, tmp_path, name):
    """Before: exit 0 and no file (sys.exit), or 130 "interrupted" (KeyboardInterrupt)."""
    out = tmp_path / "x.jsonl"
    r = run(site, "-m", "envace.cli", "data", "export-real", "--env", name, "--split", "all",
            "--out", str(out))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"environment plugin {name!r}" in r.stderr and "Traceback" not in r.stderr


def test_export_real_of_a_plugin_whose_setup_raises_costs_that_task(site, tmp_path):
    """Before: a traceback, rc 1."""
    out = tmp_path / "x.jsonl"
    r = run(site, "-m", "envace.cli", "data", "export-real", "--env", "setupfails",
            "--split", "all", "--out", str(out))
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr and "setup refuses this task" in r.stderr
    assert [json.loads(x)["task_id"] for x in out.read_text().splitlines()] == ["good"]


def test_export_real_of_a_plugin_whose_listing_hangs_is_cut_at_the_limit(site, tmp_path):
    """Before: the plugin's task_ids() ran in envace's own process, outside the call limit."""
    out = tmp_path / "o.jsonl"
    r = run(site, "-m", "envace.cli", "data", "export-real", "--env", "listhangs", "--split",
            "all", "--out", str(out), "--call-timeout", "2")
    assert r.returncode == 2, r.stderr
    assert "call limit of 2 s" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_hostile_tool_names_stay_data_in_the_terminal_and_report(site, tmp_path):
    r = run(site, "-m", "envace.cli", "envs", "hostile", "--all")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout and "\\x1b" in r.stdout
    assert "new\\x0aline" in r.stdout
    src = tmp_path / "in.jsonl"
    src.write_text("".join(_record("hostile", "t", tool) for tool in HOSTILE_TOOLS))
    r = run(site, "-m", "audit.cli", "--quiet", "replay", str(src), "--out", str(tmp_path / "o"))
    assert r.returncode in (0, 3), r.stderr
    assert "\x1b" not in r.stderr + r.stdout
    report = (tmp_path / "o" / "report.md").read_text()
    assert "<img" not in report and "![](" not in report and "\x1b" not in report
    tool_rows = [x for x in report.splitlines() if x.startswith("| ") and "evil" in x]
    assert tool_rows and all(x.count("|") - x.count("\\|") == 4 for x in tool_rows)


def test_escaping_is_pure_and_keeps_plain_text():
    assert terminal_safe("get_user_stats é ✓") == "get_user_stats é ✓"
    assert terminal_safe("a\x1b[31mb\nc\ud800") == "a\\x1b[31mb\\x0ac\\ud800"
    assert markdown_safe("a|b") == "a\\|b"
    assert markdown_safe("<img src=x>") == "&lt;img src=x&gt;"
    assert markdown_safe("![](u)") == "\\!\\[\\](u)"
