"""The learned ranker (audit.worlds.ranker, issue #17): a world model that picks among real
responses and their copy-edits by features of the call and the conversation so far.

- `response_values` (hypothesis): a JSON response's values are its leaf strings and numbers,
  booleans and null never; other text gives its words of three or more characters;
- `history_text`: every message's content and its calls' arguments, dict or string;
- `candidate_rows` (hypothesis, over memories of pure data): one feature per name, no two
  candidates equal, none that only the asking task's own scenario returned, ``edit``'s
  answer first; on real BFCL dev calls the first candidate is the audit's ``edit`` reference;
- `fit_ranker` learns what the lookup cannot know: on toy trajectories (pure data, named as
  such) whose right answer is the name the user gave, it answers a held-out call with that
  name where the lookup answers the most common one; a fit with nothing right is refused;
- `envace probe --ranker` on real BFCL trajectories: the audit directory, its label and
  `world_model.ranker` block, and the refusals (with --model, with neither, a dev file).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.pipeline import reference_triples
from audit.scoring.canonical import canonical_text
from audit.worlds.memory import Entry, ResponseMemory, scenario_key
from audit.worlds.ranker import (
    FEATURES,
    candidate_rows,
    fit_ranker,
    history_text,
    response_values,
    training_calls,
)
from audit.worlds.reference import build_reference
from envace.core.schema import Trajectory, read_trajectories

LEAF = st.one_of(st.text(max_size=6), st.integers(-99, 99), st.booleans(), st.none())
JSONISH = st.recursive(LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=10)


def _leaves(v):
    if isinstance(v, dict):
        return [x for y in v.values() for x in _leaves(y)]
    if isinstance(v, list):
        return [x for y in v for x in _leaves(y)]
    if isinstance(v, bool) or v is None or str(v) == "":
        return []
    return [str(v)]


@settings(max_examples=300, deadline=None)
@given(JSONISH)
def test_response_values_are_the_json_leaves(value):
    assert Counter(response_values(json.dumps(value))) == Counter(_leaves(value))


def test_response_values_of_plain_text_and_history_text():
    assert response_values("Moved to docs ok") == ["Moved", "docs"]
    messages = [{"role": "user", "content": "go to docs"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"id": "c0", "function": {"name": "cd",
                                                          "arguments": {"folder": "tmp"}}},
                                {"id": "c1", "function": {"name": "ls", "arguments": "{}"}}]},
                {"role": "tool", "content": None}]
    text = history_text(messages)
    assert "go to docs" in text and '{"folder": "tmp"}' in text and "{}" in text


SCEN = st.sampled_from(["multi_turn_base_1", "multi_turn_base_2", "multi_turn_miss_func_3",
                        "multi_turn_base_4"])
ENTRY = st.builds(Entry, st.sampled_from(["cd", "ls"]),
                  st.dictionaries(st.sampled_from(["folder", "a"]),
                                  st.sampled_from(["docs", "tmp", "x"]), max_size=2),
                  st.sampled_from(['{"d": "docs"}', '{"d": "tmp"}', "{}", '{"n": 1}']), SCEN)


@settings(max_examples=200, deadline=None)
@given(st.lists(ENTRY, min_size=1, max_size=12), SCEN, st.sampled_from(["cd", "ls"]),
       st.dictionaries(st.sampled_from(["folder", "a"]), st.sampled_from(["docs", "tmp", "y"]),
                       max_size=2), st.text(max_size=20))
def test_candidate_rows_properties(entries, task, tool, arguments, history):
    memory = ResponseMemory(entries, "pure data")
    rows = candidate_rows(memory, tool, arguments, task, history, k=3)
    own = scenario_key(task)
    others = [e for e in entries if e.tool == tool and scenario_key(e.task_id) != own]
    if not others:
        assert rows == []
        return
    keys = [key for key, *_ in rows]
    assert len(keys) == len(set(keys)) and keys == [canonical_text(t) for _, t, *_ in rows]
    assert all(len(f) == len(FEATURES) for *_, f in rows)
    seen = {canonical_text(e.response) for e in others}
    for key, _, source, _ in rows:
        if source in ("exact", "similar", "majority"):
            assert key in seen  # a real response of another scenario, never the own one's
    assert rows[0][2] == "edit" and dict(zip(FEATURES, rows[0][3], strict=True))["from_edit"]


@pytest.fixture(scope="module")
def files(small_real_files):
    return small_real_files  # conftest: the first 40 train and 4 dev tasks, real


def test_first_candidate_is_the_edit_reference_on_real_calls(files):
    memory = ResponseMemory.from_file(files["train"])
    edit = build_reference("edit", reference_triples(files["train"]))
    checked = 0
    for item in read_trajectories(files["dev"]):
        traj = item.trajectory
        for stp in traj.tool_steps():
            if stp.arguments is None or stp.response is None:
                continue
            rows = candidate_rows(memory, stp.tool, stp.arguments, traj.task_id, "")
            want = edit(stp.tool, stp.arguments)
            if rows:
                assert rows[0][0] == canonical_text(want)
                checked += 1
            else:
                assert want == "{}"
    assert checked > 10


def _toy(task: str, name: str, tool: str = "whoami") -> Trajectory:
    """A toy trajectory (pure data, not a real environment's): the user says a name, the call's
    real response is that name."""
    return Trajectory.model_validate({
        "id": f"toy-{task}", "task_id": task, "env": {"name": "toy", "task": task},
        "source": "real",
        "messages": [
            {"role": "user", "content": f"Hello, I am {name}."},
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": "c0", "type": "function",
                             "function": {"name": tool, "arguments": {}}}]},
            {"role": "tool", "content": json.dumps({"user": name}), "tool_call_id": "c0",
             "name": tool}]})


def test_fit_learns_what_the_conversation_says(tmp_path):
    names = ["alice"] * 20 + ["bob"] * 8 + ["carol"] * 8 + ["dan"] * 8
    trajs = [_toy(f"multi_turn_base_{i}", n) for i, n in enumerate(names)]
    memory = ResponseMemory([e for t in trajs for e in _entries(t)], "toy data")
    ranker = fit_ranker(memory, trajs)
    assert ranker.fit_calls == len(trajs) and ranker.fit_right == len(trajs)
    held_out = _toy("multi_turn_base_999", "carol")
    messages = [m.dump() for m in held_out.messages[:2]]
    assert json.loads(ranker(messages, None, "whoami", {})) == {"user": "carol"}
    lookup = memory.exact("whoami", {}, "multi_turn_base_999")
    assert json.loads(lookup) == {"user": "alice"}  # what the lookup (and edit) answer
    tally: dict[str, int] = {}
    got = ranker.batch(tally)([(messages, None, "whoami", {}), (messages, None, "nope", {})],
                              ["multi_turn_base_999", "multi_turn_base_999"])
    assert json.loads(got[0]) == {"user": "carol"} and got[1] == "{}"
    assert tally["none"] == 1 and sum(tally.values()) == 2
    block = ranker.block(tally)
    assert block["fit"]["calls"] == len(trajs) and block["chosen"]["none"] == 1
    one = [_toy(f"multi_turn_base_{i}", "alice") for i in range(3)]
    with pytest.raises(ValueError, match="cannot fit"):  # every candidate right: nothing to learn
        fit_ranker(ResponseMemory([e for t in one for e in _entries(t)], "toy"), one)


def test_fit_history_holds_the_earlier_calls_of_the_same_message():
    """A message with two calls: the second call's history has the first call's response, as
    the probe shows it; the rollout hook leaves system messages out and keeps the rest."""
    traj = Trajectory.model_validate({
        "id": "toy-2", "task_id": "multi_turn_base_5", "env": {"name": "toy", "task": "t"},
        "source": "real", "messages": [
            {"role": "user", "content": "two at once"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "a", "arguments": {}}},
                {"id": "c1", "type": "function", "function": {"name": "b", "arguments": {}}}]},
            {"role": "tool", "content": "FIRSTANSWER", "tool_call_id": "c0", "name": "a"},
            {"role": "tool", "content": "SECOND", "tool_call_id": "c1", "name": "b"}]})
    (_, _, _, h0, r0), (_, _, _, h1, r1) = training_calls([traj])
    assert (r0, r1) == ("FIRSTANSWER", "SECOND")
    assert "FIRSTANSWER" not in h0 and "FIRSTANSWER" in h1 and "SECOND" not in h1
    trajs = [_toy(f"multi_turn_base_{i}", n) for i, n in
             enumerate(["alice"] * 12 + ["bob"] * 6 + ["carol"] * 6)]
    ranker = fit_ranker(ResponseMemory([e for t in trajs for e in _entries(t)], "toy"), trajs)
    said = [{"role": "user", "content": "Hello."},
            {"role": "system", "content": "Rehearsal memory: I am carol."}]
    assert json.loads(ranker.exact("whoami", {}, "multi_turn_base_99", said)) == {"user": "alice"}
    said[1]["role"] = "user"
    assert json.loads(ranker.exact("whoami", {}, "multi_turn_base_99", said)) == {"user": "carol"}
    assert ranker.exact("never_called", {}, "multi_turn_base_99", said) is None
    assert ranker.source == "toy"


def _entries(traj: Trajectory) -> list[Entry]:
    return [Entry(s.tool, dict(s.arguments), s.response.content, traj.task_id)
            for s in traj.tool_steps()]


def test_probe_cli_ranker(files, tmp_path):
    out = tmp_path / "probe"
    base = [sys.executable, "-m", "envace.cli", "probe", str(files["dev"]), "--quiet"]
    r = subprocess.run([*base, "--out", str(out), "--ranker", str(files["train"]),
                        "--reference", str(files["train"])], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["audited_model"] == "ranker(k=8)"
    block = summary["world_model"]["ranker"]
    assert block["file"] == str(files["train"]) and block["fit"]["calls"] > 0
    assert sum(block["chosen"].values()) == summary["counts"]["steps"] > 0
    edit = build_reference("edit", reference_triples(files["train"]))
    rows = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert all(r["rehearsed"] is not None for r in rows)
    # its answers are real training responses or their copy-edits: on calls where only one
    # candidate exists it answers what edit answers
    assert sum(canonical_text(r["rehearsed"]) == canonical_text(edit(r["tool"], r["arguments"]))
               for r in rows) >= len(rows) // 2
    for extra, why in (([], "--ranker is a world model of its own"),):
        bad = subprocess.run([*base, "--out", str(tmp_path / "no"), "--ranker",
                              str(files["train"]), "--model", "smollm2", *extra],
                             capture_output=True, text=True)
        assert bad.returncode == 2 and why in bad.stderr
    for served in (["--api", "chat"], ["--concurrency", "0"], ["--max-new-tokens", "9"]):
        bad = subprocess.run([*base, "--out", str(tmp_path / "no"), "--ranker",
                              str(files["train"]), *served], capture_output=True, text=True)
        assert bad.returncode == 2 and f"not with {served[0]}" in bad.stderr
    assert block["train_split_inputs"] == 0
    insample = subprocess.run([*base[:4], str(files["train"]), "--limit", "2", "--quiet",
                               "--out", str(tmp_path / "in"), "--ranker", str(files["train"])],
                              capture_output=True, text=True)
    assert insample.returncode == 0 and "in-sample" in insample.stderr
    wm = json.loads((tmp_path / "in" / "summary.json").read_text())["world_model"]["ranker"]
    assert wm["train_split_inputs"] == 40  # the input file's trajectories, before --limit
    neither = subprocess.run([*base, "--out", str(tmp_path / "no")], capture_output=True,
                             text=True)
    assert neither.returncode == 2 and "give --model" in neither.stderr
    dev = subprocess.run([*base, "--out", str(tmp_path / "no"), "--ranker", str(files["dev"])],
                         capture_output=True, text=True)
    assert dev.returncode == 2 and "train split" in dev.stderr
    assert not (tmp_path / "no").exists()
