"""A memory of real responses and the hybrid world model (audit.worlds.memory, issue #17 lever 2).

- retrieval properties (hypothesis): never the asking task's own scenario, at most k, the tool
  asked, deterministic, an identical call from another scenario first;
- the split guard: only a train-split real trajectory file becomes a memory;
- the note's rendering (a known answer) and its character budget;
- the hybrid on real BFCL dev trajectories with a train-split memory and a scripted world model
  of pure logic as "the model": where the lookup has the identical call the hybrid answers as the
  lookup (so its exact-match rate there is the lookup's), elsewhere exactly as the model;
- `envace probe --memory ... --hybrid ... --reference ...` on a tiny model.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.pipeline import reference_triples
from audit.probe import run_probe
from audit.scoring.canonical import canonical_text
from audit.scoring.settings import AuditOptions
from audit.worlds.memory import (
    NOTE_TITLE,
    Entry,
    MemoryOptions,
    ResponseMemory,
    memory_batch,
    render_note,
    scenario_key,
    split_violations,
    with_note,
    with_notes_before_responses,
)
from audit.worlds.reference import build_reference
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.errors import UsageError
from envace.core.export import export_real
from envace.core.schema import TrajectoryWriter
from envace.core.worldmodel import from_lookup

QUIET = {"progress": False, "plots": False}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("memory")
    paths = {}
    for name, tasks in (("train", split_tasks("train")[:60]), ("dev", split_tasks("dev")[:6])):
        paths[name] = d / f"{name}.jsonl"
        with TrajectoryWriter(paths[name], mode="w") as w:
            for t in export_real(tasks):
                w.write(t)
    return paths


# ---------------------------------------------------------------- scenarios and retrieval


def test_scenario_key():
    assert scenario_key("multi_turn_base_12") == "bfcl:12"
    assert scenario_key("multi_turn_miss_func_12") == "bfcl:12"
    assert scenario_key("multi_turn_long_context_12@t2") == "bfcl:12"
    assert scenario_key("multi_turn_base_120") != scenario_key("multi_turn_base_12")
    assert scenario_key("workspace/user_task_3") == "workspace/user_task_3"
    assert scenario_key("workspace/user_task_3") != scenario_key("slack/user_task_3")


TASKS = st.sampled_from([
    "multi_turn_base_1", "multi_turn_miss_func_1", "multi_turn_base_2@t1",
    "multi_turn_long_context_3", "workspace/user_task_1", "slack/user_task_1",
])
ARGS = st.dictionaries(st.sampled_from(["a", "path", "n"]),
                       st.one_of(st.integers(0, 3), st.sampled_from(["x", "xy", "docs"])),
                       max_size=2)
ENTRIES = st.lists(st.builds(Entry, st.sampled_from(["cd", "ls"]), ARGS,
                             st.sampled_from(["ok", "{}", "error"]), TASKS), max_size=25)


@settings(max_examples=200, deadline=None)
@given(ENTRIES, TASKS, st.sampled_from(["cd", "ls", "rm"]), ARGS, st.integers(0, 5))
def test_retrieval_properties(entries, task, tool, arguments, k):
    memory = ResponseMemory(entries)
    got = memory.similar(tool, arguments, task, k)
    assert len(got) <= k
    assert all(e.tool == tool for e in got)
    # never an entry only the asking task's scenario has (an identical pair from another
    # scenario may stand for it: then the entry shown is the first seen of that pair)
    own = scenario_key(task)
    for e in got:
        assert any(scenario_key(x.task_id) != own for x in entries
                   if (x.tool, x.key, canonical_text(x.response))
                   == (e.tool, e.key, canonical_text(e.response)))
    if not any(scenario_key(x.task_id) != own for x in entries):
        assert got == []
    # deterministic: again, and from a memory built anew
    assert got == memory.similar(tool, arguments, task, k)
    assert got == ResponseMemory(list(entries)).similar(tool, arguments, task, k)
    # an identical call from another scenario ranks first
    twin = [x for x in entries if x.tool == tool and x.arguments == arguments
            and scenario_key(x.task_id) != own]
    if twin and k:
        assert got[0].key == twin[0].key
    # the exact answer exists exactly when such a twin does
    assert (memory.exact(tool, arguments, task) is not None) == bool(twin)


def test_exact_is_the_lookup_reference(files):
    """On dev calls (no shared scenario with train) the exact answer is the audit's lookup."""
    memory = ResponseMemory.from_file(files["train"])
    lookup = build_reference("lookup", reference_triples(files["train"]))
    assert [(e.tool, e.arguments, e.response) for e in memory.entries] == \
        reference_triples(files["train"])
    hits = 0
    for traj in export_real(split_tasks("dev")[:6]):
        for s in traj.tool_steps():
            exact = memory.exact(s.tool, s.arguments, traj.task_id)
            if exact is not None:
                hits += 1
                assert exact == lookup(s.tool, s.arguments)
    assert hits > 0
    # a train call asked from its own scenario is never answered from that scenario
    e = memory.entries[0]
    same = [x for x in memory.entries if (x.tool, x.key) == (e.tool, e.key)]
    if all(scenario_key(x.task_id) == scenario_key(e.task_id) for x in same):
        assert memory.exact(e.tool, e.arguments, e.task_id) is None


# ---------------------------------------------------------------- the split guard


def test_split_guard(files, tmp_path):
    assert len(ResponseMemory.from_file(files["train"])) > 0
    with pytest.raises(UsageError, match="not train-split tasks.*export-real --split train"):
        ResponseMemory.from_file(files["dev"])
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(files["train"].read_text() + files["dev"].read_text())
    with pytest.raises(UsageError, match=r"6 of \d+ trajectories"):
        ResponseMemory.from_file(mixed)
    from envace.core.envs.agentdojo.tasks import split_ids

    train, dev = split_ids("train")[0], split_ids("dev")[0]
    assert split_violations([("agentdojo", train), ("bfcl", "multi_turn_base_0@t1")]) == []
    assert len(split_violations([("agentdojo", dev), ("toy", "t1")])) == 2
    with pytest.raises(UsageError, match="cannot read"):
        ResponseMemory.from_file(tmp_path / "missing.jsonl")


# ---------------------------------------------------------------- the note


def test_note_rendering_known_answer():
    entries = [Entry("cd", {"folder": "docs"}, '{"current_working_directory": "docs"}', "t"),
               Entry("cd", {"folder": "a" * 300}, "x" * 400, "t")]
    assert render_note(entries) == (
        "Similar calls and what the real environment returned:\n"
        'call: cd({"folder":"docs"})\n'
        'returned: {"current_working_directory": "docs"}\n'
        f'call: cd({{"folder":"{"a" * 189}...)\n'
        f"returned: {'x' * 300}...")
    first_only = render_note(entries, max_chars=200)
    assert first_only.count("call: ") == 1 and first_only.startswith(NOTE_TITLE)
    assert render_note(entries, max_chars=10) == "" and render_note([]) == ""
    messages = [{"role": "user", "content": "hi"}]
    assert with_note(messages, "") == messages
    assert with_note(messages, "n")[-1] == {"role": "system", "content": "n"}


def test_memory_batch_shows_the_note_last():
    memory = ResponseMemory([Entry("cd", {"folder": "docs"}, "ok", "multi_turn_base_1"),
                             Entry("cd", {"folder": "src"}, "ok2", "multi_turn_base_2")])
    seen = []

    def inner(requests):  # scripted: records what it is shown
        seen.extend(requests)
        return ["answer"] * len(requests)

    ask = memory_batch(inner, memory, k=3)
    msgs = [{"role": "user", "content": "go"}]
    assert ask([(msgs, None, "cd", {"folder": "docs"}), (msgs, None, "ls", {})],
               ["multi_turn_miss_param_2", "multi_turn_base_9"]) == ["answer", "answer"]
    note = seen[0][0][-1]
    assert note["role"] == "system" and "docs" in note["content"] and "src" not in note["content"]
    assert seen[1][0] == msgs  # a tool the memory never saw: no note


def test_notes_before_responses_are_the_probes_notes(files):
    """What `envace sft --memory-k` trains on: before every tool response of a real train
    trajectory, exactly the note the probe shows (`memory_batch`) for that call asked with the
    conversation so far; every other message unchanged and in order."""
    from envace.core.schema import read_trajectories

    trajs = [i.trajectory for i in read_trajectories(files["train"]) if i.trajectory]
    memory = ResponseMemory.from_file(files["train"])
    shown_to_probe: list = []

    def inner(requests):  # scripted: records the conversation the probe's world model sees
        shown_to_probe.extend(requests)
        return [""] * len(requests)

    probe = memory_batch(inner, memory, k=2)
    n_notes = 0
    for traj in trajs[:20]:
        msgs = [m.dump() for m in traj.messages]
        shown = with_notes_before_responses(msgs, traj.tool_steps(), memory, traj.task_id, k=2)
        assert [m for m in shown if not m.get("memory")] == msgs
        responses = [i for i, m in enumerate(shown) if m.get("role") == "tool"]
        assert len(responses) == len(traj.tool_steps())
        for i, step in zip(responses, traj.tool_steps(), strict=True):
            shown_to_probe.clear()
            probe([(msgs[:step.message_index + 1], None, step.tool, step.arguments)],
                  [traj.task_id])
            last = shown_to_probe[0][0][-1]
            want = last["content"] if last["role"] == "system" else ""
            got = shown[i - 1]["content"] if shown[i - 1].get("memory") else ""
            assert got == want
            n_notes += bool(got)
    assert n_notes > 20


def test_notes_before_responses_known_answer():
    from envace.core.schema import Trajectory

    memory = ResponseMemory([Entry("cd", {"folder": "docs"}, "A", "multi_turn_base_1"),
                             Entry("cd", {"folder": "tmp"}, "B", "multi_turn_base_2")])
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "cd", "arguments": {"folder": "t"}}}]}
    msgs = [{"role": "user", "content": "go"}, call,
            {"role": "tool", "tool_call_id": "c0", "name": "cd", "content": "x"},
            {"role": "tool", "tool_call_id": "c9", "name": "ls", "content": "y"}]
    steps = Trajectory.model_validate({
        "id": "t", "task_id": "multi_turn_base_2", "source": "real", "messages": msgs,
        "env": {"name": "bfcl", "task": "multi_turn_base_2"}}).tool_steps()
    out = with_notes_before_responses(msgs, steps, memory, "multi_turn_base_2", k=3)
    # scenario 2's own entry is never shown; a response to no call gets no note
    assert out == [msgs[0], call,
                   {"role": "system", "memory": True,
                    "content": f"{NOTE_TITLE}\ncall: cd({{\"folder\":\"docs\"}})\nreturned: A"},
                   msgs[2], msgs[3]]
    assert len(msgs) == 4  # the input is not changed
    # a call with malformed arguments gets no note
    bad = [msgs[0], {**call, "tool_calls": [{**call["tool_calls"][0], "function": {
        "name": "cd", "arguments": "{not json"}}]}, msgs[2]]
    steps = Trajectory.model_validate({
        "id": "t", "task_id": "multi_turn_base_2", "source": "real", "messages": bad,
        "env": {"name": "bfcl", "task": "multi_turn_base_2"}}).tool_steps()
    assert with_notes_before_responses(bad, steps, memory, "multi_turn_base_2") == bad


# ---------------------------------------------------------------- the hybrid


def _echo_model(messages, tools, tool, arguments):
    """Scripted world model of pure logic ("the model"): answers with the arguments as JSON."""
    return json.dumps(arguments, sort_keys=True)


def _batch(world_model):
    return lambda requests: [world_model(*r) for r in requests]


def _exact_by_step(out):
    rows = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    return {(r["trajectory_id"], r["step"]): (r["scores"]["exact"], r["rehearsed"]) for r in rows}


def test_hybrid_known_answer(files, tmp_path, monkeypatch):
    import audit.stats.summary

    monkeypatch.setattr(audit.stats.summary, "N_BOOT", 50)
    monkeypatch.setattr(audit.stats.summary, "LOGISTIC_BOOT", 5)
    memory = ResponseMemory.from_file(files["train"])
    lookup = build_reference("lookup", reference_triples(files["train"]))
    dev = [str(files["dev"])]
    opts = AuditOptions(**QUIET)
    run_probe(dev, tmp_path / "lookup", from_lookup(lookup), opts)
    run_probe(dev, tmp_path / "model", _echo_model, opts)
    grounding = MemoryOptions(hybrid=memory)
    answer, block = grounding.wrap(_batch(_echo_model))
    summary = run_probe(dev, tmp_path / "hybrid", None, opts, answer_batch=answer,
                        task_ids=True, extra=block, label=grounding.label("echo"))
    by_lookup, by_model = _exact_by_step(tmp_path / "lookup"), _exact_by_step(tmp_path / "model")
    by_hybrid = _exact_by_step(tmp_path / "hybrid")
    assert by_hybrid.keys() == by_lookup.keys() == by_model.keys()
    trajs = {t.id: t for t in export_real(split_tasks("dev")[:6])}
    answered = [k for k in by_hybrid
                if memory.exact(trajs[k[0]].tool_steps()[k[1]].tool,
                                trajs[k[0]].tool_steps()[k[1]].arguments,
                                trajs[k[0]].task_id) is not None]
    elsewhere = [k for k in by_hybrid if k not in answered]
    assert answered and elsewhere
    rate = lambda table, keys: sum(table[k][0] for k in keys) / len(keys)  # noqa: E731
    assert rate(by_hybrid, answered) >= rate(by_lookup, answered)
    assert all(by_hybrid[k] == by_lookup[k] for k in answered)
    assert rate(by_hybrid, elsewhere) == rate(by_model, elsewhere)
    assert all(by_hybrid[k] == by_model[k] for k in elsewhere)
    assert summary["audited_model"] == "hybrid(lookup,echo)"
    wm = summary["world_model"]["hybrid"]
    assert (wm["answered_by_lookup"], wm["answered_by_model"]) == (len(answered), len(elsewhere))
    assert wm["file"] == str(files["train"])


def test_task_ids_reach_the_world_model(files, tmp_path):
    seen: list[tuple[str, str]] = []

    def answer(requests, task_ids):
        seen.extend(zip([r[2] for r in requests], task_ids, strict=True))
        return ["x"] * len(requests)

    run_probe([str(files["dev"])], tmp_path / "p", None, AuditOptions(**QUIET),
              answer_batch=answer, task_ids=True)
    dev = list(export_real(split_tasks("dev")[:6]))
    assert sorted(seen) == sorted((s.tool, t.task_id) for t in dev for s in t.tool_steps())
    with pytest.raises(ValueError, match="task_ids needs answer_batch"):
        run_probe([str(files["dev"])], tmp_path / "q", _echo_model, task_ids=True)


# ---------------------------------------------------------------- the CLI


def test_probe_cli_memory_and_hybrid(files, tmp_path):
    from envace.model.models import build_tiny
    from envace.training.sft import training_texts

    model_dir = build_tiny(training_texts(list(export_real(split_tasks("train")[:4]))),
                           tmp_path / "tiny")
    out = tmp_path / "probe"
    base = [sys.executable, "-m", "envace.cli", "probe", "--model", str(model_dir),
            str(files["dev"]), "--limit", "2", "--max-new-tokens", "6", "--quiet"]
    r = subprocess.run([*base, "--out", str(out), "--memory", str(files["train"]),
                        "--memory-k", "2", "--hybrid", str(files["train"]),
                        "--reference", str(files["train"])], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["audited_model"] == f"hybrid(lookup,{model_dir}+memory(k=2))"
    wm = summary["world_model"]
    assert wm["memory"]["k"] == 2 and wm["memory"]["file"] == str(files["train"])
    assert wm["hybrid"]["answered_by_lookup"] + wm["hybrid"]["answered_by_model"] == \
        summary["counts"]["steps"] > 0
    assert "lookup" in json.dumps(summary["skill"])
    refused = subprocess.run([*base, "--out", str(tmp_path / "no"), "--memory", str(files["dev"])],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "train split" in refused.stderr
    assert not (tmp_path / "no").exists()
    lone_k = subprocess.run([*base, "--out", str(tmp_path / "no"), "--memory-k", "2"],
                            capture_output=True, text=True)
    assert lone_k.returncode == 2 and "--memory-k needs --memory" in lone_k.stderr
