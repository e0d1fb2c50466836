"""Issue #39: a lone surrogate (valid JSON ``"\\ud800"``) anywhere costs at most its record.

Before: the writer (``json.dumps(ensure_ascii=False)`` then UTF-8) or the tokenizer raised, the
audit exited 1 with nothing written. Now every JSON writer escapes such a value (it reads back
as the same data), ``hash_state`` hashes it, and the tokenizer sees U+FFFD in its place.
"""

from __future__ import annotations

import json
from unittest import mock

import pytest

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from envace.core.envs.base import ToolResult, hash_state, register_env
from envace.core.schema import TrajectoryWriter, json_text, read_trajectories

S = "\ud800"


@register_env("test-surrogate")
class SurrogateEnv:
    """A plugin whose tool answers text with a lone surrogate, and keeps it in its state."""

    name = "test-surrogate"

    def reset(self, task):
        self.seen = []

    def tools(self):
        return []

    def execute(self, tool, arguments):
        self.seen.append(f"got {S}")
        return ToolResult(f"answer {S} from {tool}")

    def state(self):
        return {"seen": self.seen}

    def state_hash(self):
        return hash_state(self.state())

    def tool_kind(self, tool):
        return None


def test_json_text_round_trips_and_is_unchanged_otherwise():
    assert json_text({"a": "é"}) == '{"a": "é"}'
    text = json_text({"a": f"x{S}"})
    text.encode("utf-8")
    assert json.loads(text) == {"a": f"x{S}"}
    assert hash_state({"a": S}) != hash_state({"a": "x"})
    # ASCII text (the fast path: no encoding to look for a surrogate) is json.dumps's
    for data in ({"a": 1, "b": [1.5, None, True]}, "\\ud800 escaped already", [], {"k": "\x7f"}):
        assert json_text(data) == json.dumps(data, ensure_ascii=False)
        assert json_text(data, sort_keys=True) == json.dumps(data, ensure_ascii=False,
                                                              sort_keys=True)


def _traj(tid: str, tool: str, content: str, env: dict) -> dict:
    return {"schema": "envace.trajectory/1", "id": tid, "task_id": "t", "env": env,
            "source": "rehearsed", "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c0", "type": "function",
                     "function": {"name": tool, "arguments": {"a": 1, "b": 2}}}]},
                {"role": "tool", "tool_call_id": "c0", "name": tool, "content": content,
                 "rehearsed": True}]}


@pytest.mark.parametrize("workers", [1, 2])
def test_surrogates_in_ids_responses_and_plugin_answers_are_audited(tmp_path, workers):
    math = {"name": "bfcl", "state": {"involved_classes": ["MathAPI"]}}
    recs = [_traj(f"id{S}", "add", '{"result": 3}', math),
            _traj("resp", "add", f'{{"result": "{S}"}}', math),
            _traj("plugin", "anything", "x", {"name": "test-surrogate", "task": "t"}),
            _traj("tool", f"add{S}", "x", math),
            _traj("plain", "add", '{"result": 3}', math)]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))  # ASCII escapes: valid JSON
    with mock.patch("audit.store.report.plot_all", return_value=[]):
        s = run_audit([str(src)], tmp_path / "out",
                      AuditOptions(workers=workers, progress=False, plots=False))
    assert s["counts"]["trajectories"] == 5 and s["counts"]["skipped"] == 0
    rows = [json.loads(x) for x in
            (tmp_path / "out" / "steps.jsonl").read_text(encoding="utf-8").splitlines()]
    by_id = {r["trajectory_id"]: r for r in rows}
    assert by_id["plugin"]["actual"] == f"answer {S} from anything"  # kept exactly
    assert f"id{S}" in by_id
    assert (tmp_path / "out" / "report.md").exists()


def test_trajectory_writer_and_reader_keep_a_surrogate(tmp_path):
    p = tmp_path / "t.jsonl"
    rec = _traj(f"x{S}", "add", S, {"name": "bfcl", "task": "multi_turn_base_0"})
    with TrajectoryWriter(p, mode="w") as w:
        w.write(rec)
    (item,) = list(read_trajectories(p))
    assert item.trajectory is not None and item.trajectory.id == f"x{S}"


def test_the_tokenizer_sees_a_replacement_character():
    from envace.model.chat import encode_text
    from envace.model.tokenizer_train import train_tokenizer

    tok = train_tokenizer(["<|im_start|>user\nhi there<|im_end|>\n"] * 4, vocab_size=512)
    assert encode_text(tok, f"hi {S} there") == encode_text(tok, "hi \ufffd there")
