"""Issue #39 (B4): a response or a record past the size limits costs one task of an export.

``envace data export-real`` of an environment (registered in this process: the guard forks, so
its child has it) whose one task answers 2 MB, one answers 66 calls of just under 1 MiB (a 66 MB
line), and whose other tasks answer normally: the two are named as skipped (exit 3), every other
task is written, and what is written passes the audit's own readers (``MAX_CALL_BYTES`` a
response, ``MAX_LINE_BYTES`` a line: docs/audit.md, "Size limits").
"""

from __future__ import annotations

import json

from envace.cli.main import main
from envace.core.envs.base import ToolResult, register_env
from envace.core.schema import MAX_CALL_BYTES, MAX_LINE_BYTES

#: each task's response size; "many" has 66 responses, each under the call limit, that together
#: pass the line limit
SIZES = {"a": 3, "big": 2_000_000, "many": MAX_CALL_BYTES - 100, "z": 3}
CALLS = {"many": MAX_LINE_BYTES // (MAX_CALL_BYTES - 100) + 2}


@register_env("test-bigout")
class BigOut:
    """One tool whose answer's size is set per task."""

    name = "test-bigout"

    def reset(self, task):
        self.task = task

    def tools(self):
        return [{"type": "function", "function": {"name": "get", "parameters": {}}}]

    def task_ids(self):
        return list(SIZES)

    def task_prompt(self, task_id):
        return "get it"

    def ground_truth(self, task_id):
        return [("get", {})] * CALLS.get(task_id, 1)

    def execute(self, tool, arguments):
        return ToolResult("x" * SIZES[self.task])

    def state(self):
        return {}

    def state_hash(self):
        return "0"

    def tool_kind(self, tool):
        return None


def test_one_response_past_the_limits_costs_its_task_not_the_export(tmp_path, capsys):
    out = tmp_path / "real.jsonl"
    rc = main(["data", "export-real", "--env", "test-bigout", "--split", "all",
               "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in rows] == ["a", "z"]
    assert "skipped big" in err and f"{MAX_CALL_BYTES}-byte limit" in err
    assert "skipped many" in err and f"{MAX_LINE_BYTES}-byte line limit" in err
