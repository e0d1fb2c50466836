"""Rehearsing with a memory of real responses inside rollouts (issue #17's lever 2, in
training and at test time): the note the probe shows, before each rehearsed response only."""

from __future__ import annotations

import pytest

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from audit.worlds.memory import ResponseMemory, render_note, scenario_key
from envace.core.envs.bfcl.tasks import get_task, split_tasks
from envace.core.export import export_real
from envace.core.schema import Trajectory, TrajectoryWriter
from envace.model import chat
from envace.model.models import build_tiny, load_model
from envace.model.rollout import CONTEXT, Engine, RolloutConfig
from envace.training.config import ConfigError, TrainConfig
from tests.conftest import play


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    texts = [chat.render([m.dump() for m in t.messages], t.tools)
             for t in export_real(split_tasks("train")[:20])]
    return load_model(build_tiny(texts, tmp_path_factory.mktemp("tiny") / "m", seed=0))


def test_the_note_precedes_each_rehearsed_response_and_is_context(tiny, train_memory):
    model, tok = tiny
    eng = Engine(model, tok, RolloutConfig(mode="rehearse", memory=train_memory, memory_k=2))
    task = get_task("multi_turn_base_0")  # a train task: its own scenario is never shown
    row = eng.start(task)
    args = {"folder": "document"}
    play(eng, row, chat.format_call("cd", args), "act")
    note = row.messages[-1]
    want = render_note(train_memory.similar("cd", args, task.id, 2))
    assert note == {"role": "system", "content": want, "memory": True} and want
    entries = train_memory.similar("cd", args, task.id, 2)
    assert entries and all(scenario_key(e.task_id) != scenario_key(task.id) for e in entries)
    forced = [t for t, _, _ in row.queue]
    text = tok.decode(forced)
    assert text.startswith("\n<|im_start|>system\n") and want in text
    assert text.endswith("<|im_start|>tool\n") and {r for _, r, _ in row.queue} == {CONTEXT}
    play(eng, row, '{"current_working_directory": "document"}', "rehearse")
    assert row.messages[-1]["role"] == "tool" and row.messages[-1]["tool_call_id"] == "c0"
    # the recorded episode audits: the note changes no step
    ep = eng.episode(row, len(row.ids))
    traj = Trajectory.model_validate(ep.trajectory.dump())
    assert [s.tool for s in traj.tool_steps()] == ["cd"]
    assert traj.tool_steps()[0].response.content.startswith('{"current_working')


def test_no_note_without_a_memory_or_when_reality_answers(tiny, train_memory):
    model, tok = tiny
    for cfg in (RolloutConfig(mode="rehearse"), RolloutConfig(mode="real", memory=train_memory),
                RolloutConfig(mode="rehearse", memory=train_memory, memory_k=0)):
        eng = Engine(model, tok, cfg)
        row = eng.start(get_task("multi_turn_base_0"))
        play(eng, row, chat.format_call("cd", {"folder": "document"}), "act")
        assert not any(m["role"] == "system" and m.get("memory") for m in row.messages)


def test_a_rollout_with_notes_audits_like_one_without(tiny, train_memory, tmp_path):
    """Two calls, each rehearsed after its note: the audit finds both steps, replays them in
    the real environment and scores the rehearsed responses; the notes change nothing."""
    model, tok = tiny
    files = {}
    for k in (0, 2):
        eng = Engine(model, tok, RolloutConfig(mode="rehearse", memory=train_memory, memory_k=k))
        row = eng.start(get_task("multi_turn_base_0"))
        play(eng, row, chat.format_call("cd", {"folder": "document"}), "act")
        play(eng, row, '{"current_working_directory": "document"}', "rehearse")
        play(eng, row, chat.format_call("ls", {}), "act")
        play(eng, row, '{"current_directory_content": []}', "rehearse")
        traj = eng.episode(row, len(row.ids)).trajectory
        notes = [m for m in traj.dump()["messages"] if m.get("memory")]
        assert len(notes) == (2 if k else 0)
        files[k] = tmp_path / f"k{k}.jsonl"
        with TrajectoryWriter(files[k], mode="w") as w:
            w.write(traj)
    s0, s2 = (run_audit([str(files[k])], tmp_path / f"audit{k}", AuditOptions(progress=False))
              for k in (0, 2))
    assert s2["counts"]["steps"] == s0["counts"]["steps"] == 2
    assert s2["divergence_rate"] == s0["divergence_rate"]
    assert s2["scores"] == s0["scores"]


def test_train_config_checks_memory_k():
    with pytest.raises(ConfigError, match="memory_k"):
        TrainConfig(mode="grpo", memory_k=3)
    with pytest.raises(ConfigError, match="memory_k"):
        TrainConfig(memory_k=-1)
    assert TrainConfig(mode="envace", memory_k=3).memory_k == 3


def test_memory_from_trajectories_refuses_held_out_tasks():
    from envace.core.errors import UsageError

    dev = export_real(split_tasks("dev")[:2])
    with pytest.raises(UsageError, match="not train-split"):
        ResponseMemory.from_trajectories(dev, "dev")


def test_a_training_step_rehearses_with_the_memory(tmp_path):
    """`envace train memory_k=2`: every rehearsed response in the step's rollouts was written
    after a note of the train split's real responses (the committed cold start makes calls)."""
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "envace.cli", "train", "--config",
                        "configs/tiny.yaml", f"output_dir={tmp_path}", "run_name=mem", "steps=1",
                        "prompts_per_step=4", "group_size=2", "eval_tasks=1", "memory_k=2",
                        "max_turns=2", "max_new_tokens=48", "checkpoint_every=0", "--quiet"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    rehearsed = 0
    for line in (tmp_path / "mem" / "rollouts" / "step_0.jsonl").read_text().splitlines():
        msgs = json.loads(line)["messages"]
        for i, m in enumerate(msgs):
            if m["role"] == "tool" and m.get("rehearsed"):
                rehearsed += 1
                assert msgs[i - 1].get("memory") or msgs[i - 1]["role"] == "tool", msgs[i - 1]
    assert rehearsed > 0
    # the run's rehearsed evaluation rehearses with the same memory and says so
    summary = json.loads((tmp_path / "mem" / "eval" / "dev_rehearsed" / "summary.json")
                         .read_text())
    assert summary["settings"]["memory"] == "the bfcl train split"
    assert summary["settings"]["memory_k"] == 2


@pytest.mark.parametrize("argv", [
    ["rollout", "--model", "tiny", "--mode", "real", "--memory-k", "2", "--out", "x.jsonl"],
    ["eval", "--model", "tiny", "--rehearsal", "none", "--memory-k", "2"]])
def test_memory_k_where_nothing_is_rehearsed_is_a_usage_error(argv, tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "envace.cli", *argv], capture_output=True,
                       text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 2 and "--memory-k" in r.stderr, r.stderr[-500:]
    assert not (tmp_path / "x.jsonl").exists()
