"""`envace sft` on τ² train trajectories: the data come through the family registry, and a
rehearse-only fine-tune trains the tool responses of every domain, telecom's over-long system
turn included (the tiny model, real τ² exports, a few steps)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.core.envs.bfcl.tasks import split_tasks as bfcl_split
from envace.core.export import export_real
from envace.model.models import SFT_META, build_tiny, load_model
from envace.model.windows import message_blocks
from envace.training.config import ConfigError
from envace.training.sft import (
    SFTSettings,
    build_examples,
    run_sft,
    train_tasks,
    training_texts,
)

ROOT = Path(__file__).resolve().parents[2]


def test_train_tasks_are_each_familys_committed_train_split():
    ids = [t.id for t in train_tasks("tau2")]
    assert ids == (ROOT / "data/splits/tau2/train.txt").read_text().split("\n")[:len(ids)]
    assert len(ids) == 132 and {i.split("/")[0] for i in ids} == {"airline", "retail", "telecom"}
    assert [t.id for t in train_tasks()] == [t.id for t in bfcl_split("train")]


def test_an_unknown_env_is_refused_naming_the_families():
    with pytest.raises(ConfigError, match="tau2"):
        SFTSettings(env="tau3")


@pytest.fixture(scope="module")
def tau2_trajs():
    tasks = train_tasks("tau2")
    one_each = [next(t for t in tasks if t.id.startswith(d + "/"))
                for d in ("airline", "retail", "telecom")]
    return list(export_real(one_each))


def test_rehearse_only_trains_the_tool_responses_of_every_domain(tau2_trajs, tmp_path):
    base = build_tiny(training_texts(tau2_trajs), tmp_path / "tiny")
    tok = load_model(base)[1]
    seq_len = 1024
    examples, stats = build_examples(tok, tau2_trajs, seq_len, roles="rehearse")
    assert stats["trajectories"] == 3 and stats["act_tokens"] == 0
    assert stats["rehearse_tokens"] > 0
    telecom = tau2_trajs[2]
    blocks, _ = message_blocks(tok, [m.dump() for m in telecom.messages], telecom.tools)
    assert len(blocks[0][0]) > seq_len  # telecom's system turn alone is longer than a window
    for ex in examples:
        assert len(ex["input_ids"]) <= seq_len and any(ex["assistant_masks"])
    # every trained token is a tool response's: none of the assistant's, the policy's or the user's
    rehearsed = 0
    for traj in tau2_trajs:
        blocks, kinds = message_blocks(tok, [m.dump() for m in traj.messages], traj.tools)
        rehearsed += sum(len(b[0]) for b, k in zip(blocks, kinds, strict=True) if k == "tool")
    assert 0 < stats["rehearse_tokens"] <= rehearsed

    out = run_sft(SFTSettings(preset=str(base), roles="rehearse", env="tau2", max_steps=3,
                              max_minutes=0, seq_len=seq_len, out=str(tmp_path / "sft")),
                  trajectories=tau2_trajs, quiet=True)
    meta = json.loads((out / SFT_META).read_text())
    assert meta["steps"] == 3 and meta["settings"]["env"] == "tau2"
    assert meta["data"]["rehearse_tokens"] == stats["rehearse_tokens"]
