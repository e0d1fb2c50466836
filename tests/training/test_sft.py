"""Tests for envace.training.sft: windows, role masks as trl builds labels, loss goes down, time
budget.

A tiny model built on a handful of real train trajectories, trained for a few dozen steps.
"""

from __future__ import annotations

import json
import time

import pytest

from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.model.chat import Role, encode_with_roles
from envace.model.models import SFT_META, build_tiny, load_model, read_sft_meta
from envace.model.windows import make_windows, message_blocks, prompt_ids
from envace.training.sft import (
    ROLE_SETS,
    SFT_LOG,
    SFTSettings,
    build_examples,
    build_trainer,
    run_sft,
    sft_messages,
    training_texts,
)


@pytest.fixture(scope="module")
def trajs():
    return list(export_real(split_tasks("train")[:8]))


@pytest.fixture(scope="module")
def base(trajs, tmp_path_factory):
    return build_tiny(training_texts(trajs), tmp_path_factory.mktemp("cache") / "tiny")


@pytest.fixture(scope="module")
def tok(base):
    return load_model(base)[1]


def test_blocks_are_turns(trajs, tok):
    msgs = sft_messages(trajs[0], "both")
    blocks, kinds = message_blocks(tok, msgs, trajs[0].tools)
    ids, _ = encode_with_roles(tok, msgs, trajs[0].tools)
    assert [t for b in blocks for t in b[0]] == ids
    assert kinds[0] == "system" and kinds[1] == "user" and len(blocks) == len(msgs) + 1


@pytest.mark.parametrize("seq_len", [300, 700, 4096])
def test_windows_fit_and_keep_every_trained_token(trajs, tok, seq_len):
    for traj in trajs:
        blocks, kinds = message_blocks(tok, sft_messages(traj, "both"), traj.tools)
        wins = make_windows(blocks, kinds, seq_len)
        assert all(len(ids) <= seq_len for ids, _ in wins)
        sys_ids = blocks[0][0][: seq_len // 2]
        assert all(ids[: len(sys_ids)] == sys_ids for ids, _ in wins)
        trained = [(t, r) for b in blocks for t, r in zip(*b, strict=True) if r != Role.CONTEXT]
        got = [(t, r) for w in wins for t, r in zip(*w, strict=True) if r != Role.CONTEXT]
        if all(len(sys_ids) + len(b[0]) <= seq_len for b in blocks[1:]):  # nothing cut
            assert got == trained
        if seq_len == 4096 and len(blocks[0][0]) + sum(len(b[0]) for b in blocks[1:]) <= 4096:
            assert len(wins) == 1


def test_prompt_keeps_system_last_user_and_latest(trajs, tok):
    traj = trajs[0]
    msgs = [m.dump() for t in trajs for m in t.messages]  # one long conversation
    blocks, _ = message_blocks(tok, msgs, traj.tools, "tool")
    full = prompt_ids(tok, msgs, traj.tools, "tool", 100_000)
    budget = 2 * len(blocks[0][0]) + 200
    cut = prompt_ids(tok, msgs, traj.tools, "tool", budget)
    assert len(cut) <= budget < len(full)
    assert cut[: len(blocks[0][0])] == blocks[0][0]
    tail = blocks[-2][0] + blocks[-1][0]
    assert cut[-len(tail):] == tail and full[-len(tail):] == tail


@pytest.mark.parametrize("roles", ["both", "act", "rehearse"])
def test_labels_follow_roles(trajs, tok, base, tmp_path, roles):
    examples, stats = build_examples(tok, trajs[:3], 1024, roles)
    model = load_model(base)[0]
    s = SFTSettings(preset=str(base), roles=roles, seq_len=1024, max_steps=1)
    trainer = build_trainer(model, tok, examples, s, tmp_path / "t")
    ds = trainer.train_dataset
    # recompute every token's role: the labels must keep exactly the trained ones
    expected = []
    for traj in trajs[:3]:
        blocks, kinds = message_blocks(tok, sft_messages(traj, roles), traj.tools)
        expected += [r for _, r in make_windows(blocks, kinds, 1024)
                     if any(x in ROLE_SETS[roles] for x in r)]
    assert len(ds) == len(expected)
    want = {"both": {Role.ACT, Role.REHEARSE}, "act": {Role.ACT},
            "rehearse": {Role.REHEARSE}}[roles]
    n_act = 0
    n_rehearse = 0
    for row, rls in zip(ds, expected, strict=True):
        assert len(row["labels"]) == len(rls) == len(row["input_ids"])
        for tid, lab, r in zip(row["input_ids"], row["labels"], rls, strict=True):
            assert lab == (tid if r in want else -100)
            n_rehearse += r == Role.REHEARSE
            n_act += r == Role.ACT
        assert any(lab != -100 for lab in row["labels"])  # no window without a trained token
    if roles == "act":
        assert n_rehearse == 0 and stats["rehearse_tokens"] == 0
    else:
        assert n_rehearse > 0 and stats["rehearse_tokens"] == n_rehearse
    if roles == "rehearse":  # act turns stay context: their tokens are not trained
        assert n_act > 0 and stats["act_tokens"] == 0
    else:
        assert stats["act_tokens"] == n_act > 0


def test_memory_notes_are_context_and_train_nothing_new(trajs, tok):
    """`memory_k`: each response follows its note (the probe's note, from other scenarios),
    the notes are context, and the trained tokens are exactly those without a memory."""
    from audit.worlds.memory import NOTE_TITLE

    plain, st0 = build_examples(tok, trajs, 8192, "rehearse")
    noted, st3 = build_examples(tok, trajs, 8192, "rehearse", memory_k=3)
    assert st3["rehearse_tokens"] == st0["rehearse_tokens"] > 0
    assert st3["tokens"] > st0["tokens"]

    def trained(exs):
        return [[t for t, m in zip(e["input_ids"], e["assistant_masks"], strict=True) if m]
                for e in exs]

    assert trained(noted) == trained(plain)
    text = "".join(tok.decode(e["input_ids"]) for e in noted)
    assert text.count(NOTE_TITLE) > 0
    for e in noted:  # no note token is trained
        masked = tok.decode([t for t, m in zip(e["input_ids"], e["assistant_masks"],
                                               strict=True) if m])
        assert NOTE_TITLE not in masked


def test_memory_k_refuses_non_train_data(tok):
    dev = list(export_real(split_tasks("dev")[:2]))
    with pytest.raises(ValueError, match="memory_k=2.*not train-split"):
        build_examples(tok, dev, 1024, "rehearse", memory_k=2)
    build_examples(tok, dev, 1024, "rehearse")  # without a memory, any data trains


def test_sft_lowers_loss_and_saves(trajs, base, tmp_path):
    out = tmp_path / "sft"
    s = SFTSettings(preset=str(base), out=str(out), max_steps=24, seq_len=384, lr=3e-3,
                    warmup_steps=4, logging_steps=8, max_minutes=0)
    assert run_sft(s, trajs, command=["test"], quiet=True) == out
    meta = read_sft_meta(out)
    assert meta["steps"] == 24 and meta["stopped_by"] == "max_steps"
    assert meta["final_loss"] < meta["initial_loss"] - 0.5
    assert meta["tokens_seen"] > 0 and meta["tokens_per_s"] > 0
    log = [json.loads(x) for x in (out / SFT_LOG).read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [8, 16, 24]
    model, tok = load_model(out)  # a normal HF folder
    assert model.num_parameters() == meta["num_parameters"]
    # same settings and data: reused, not retrained
    stamp = (out / SFT_META).stat().st_mtime_ns
    run_sft(s, trajs, quiet=True)
    assert (out / SFT_META).stat().st_mtime_ns == stamp


def test_time_budget_stops_training(trajs, base, tmp_path):
    t0 = time.perf_counter()
    s = SFTSettings(preset=str(base), out=str(tmp_path / "sft"), max_minutes=0.2,
                    epochs=1000, seq_len=256)
    out = run_sft(s, trajs, t0=t0, quiet=True)
    wall = time.perf_counter() - t0
    meta = read_sft_meta(out)
    assert meta["stopped_by"] == "time budget" and meta["steps"] > 0
    assert wall < 0.2 * 60 + 2
    assert (out / "model.safetensors").is_file()


def test_settings_reject_bad_values():
    from envace.training.config import ConfigError

    with pytest.raises(ConfigError, match="roles"):
        SFTSettings(roles="world")
    with pytest.raises(ConfigError, match="seq_len"):
        SFTSettings(seq_len=8)
    with pytest.raises(ConfigError, match="memory_k"):
        SFTSettings(memory_k=-1)
    assert SFTSettings(preset="tiny").resolved().seq_len == 2048
