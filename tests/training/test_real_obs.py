"""Learning the world from real observations (#17 lever 1): the rollout flags the tokens the real
environment wrote, ``real_obs_coef`` adds their token-mean cross-entropy to the loss of the model
that learns the world, ``anchor_fraction`` rolls a share of the groups out in reality."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.core.envs.bfcl.tasks import get_task
from envace.core.modes import TRAINING_MODES, training_mode
from envace.model import chat
from envace.model.rollout import (
    ACT,
    CONTEXT,
    REHEARSE,
    Engine,
    Episode,
    RolloutConfig,
    push_token,
    run_episodes,
)
from envace.training import grpo
from envace.training.config import ConfigError, TrainConfig, config_help, load_config

ROOT = Path(__file__).resolve().parents[2]
TINY_SFT = ROOT / "data" / "models" / "tiny-sft"


# -- the loss -------------------------------------------------------------------------------


def test_real_obs_loss_is_the_token_mean_cross_entropy():
    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(7, 11, generator=g), torch.randint(0, 11, (7,), generator=g)
    manual = sum(torch.logsumexp(logits[i], 0) - logits[i, targets[i]] for i in range(7)) / 7
    assert grpo.real_obs_loss(logits, targets).item() == pytest.approx(manual.item(), rel=1e-6)
    # a global normalizer: the micro-batches' parts add up to the whole batch's mean
    parts = grpo.real_obs_loss(logits[:3], targets[:3], 7) + grpo.real_obs_loss(
        logits[3:], targets[3:], 7)
    assert parts.item() == pytest.approx(manual.item(), rel=1e-6)
    empty = torch.zeros(0, 11, requires_grad=True)
    out = grpo.real_obs_loss(empty, torch.zeros(0, dtype=torch.long), 5)
    assert out.item() == 0.0
    out.backward()  # no token: zero, and still a gradient path


# -- the rollout flags real responses --------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    from envace.model.models import load_model

    return load_model(TINY_SFT)


def _flagged_runs(e: Episode) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, f in enumerate([*e.real_obs, False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_real_responses_are_flagged_context_tokens(tiny):
    """Each real response's text and its <|im_end|> are flagged, right after the forced
    `<|im_start|>tool\\n`; they stay CONTEXT (out of the policy loss, no log-prob)."""
    model, tok = tiny
    eng = Engine(model, tok, RolloutConfig(mode="real", max_turns=5))
    row = eng.start(get_task("multi_turn_base_0"))
    row.gen, row.buf = "act", chat.encode_text(tok, chat.format_call(
        "cd", {"folder": "document"})) + [eng.im_end]
    eng.finish_message(row)
    while row.queue:
        push_token(eng, row, 0, 0.0, eng.cfg, tok)
    ep = eng.episode(row, 0)
    assert len(ep.real_obs) == len(ep.ids)
    (start, end), = _flagged_runs(ep)
    content = ep.trajectory.messages[-1].content
    assert tok.decode(ep.ids[start:end]) == content + chat.IM_END and "document" in content
    assert tok.decode(ep.ids[:start]).endswith("<|im_start|>tool\n")
    assert {ep.roles[i] for i in range(start, end)} == {CONTEXT}


def test_sampled_real_episodes_flag_every_real_response_and_nothing_else(tiny):
    model, tok = tiny
    tasks = [get_task("multi_turn_base_0"), get_task("multi_turn_base_1")] * 2
    eps = run_episodes(model, tok, tasks, RolloutConfig(mode="real", max_new_tokens=64,
                                                        max_turns=3, max_context=3000, seed=3))
    seen = 0
    for e in eps:
        real = [m.content + chat.IM_END for m in e.trajectory.messages
                if m.role == "tool" and not m.rehearsed]
        assert [tok.decode(e.ids[a:b]) for a, b in _flagged_runs(e)] == real
        assert all(e.roles[i] == CONTEXT and e.logprobs[i] == 0.0
                   for i, f in enumerate(e.real_obs) if f)
        seen += len(real)
    assert seen > 0, "the tiny policy made no call: nothing was checked"
    rehearsed = run_episodes(model, tok, tasks[:2], RolloutConfig(
        mode="rehearse", max_new_tokens=32, max_turns=2, max_context=3000))
    assert all(e.real_obs == [] for e in rehearsed)


# -- the update ------------------------------------------------------------------------------


def _qwen(seed: int) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=128))


def _episodes(n: int, rehearse: bool = True, seed: int = 1) -> tuple[list[Episode], Any]:
    """Synthetic episodes: prompt, act, a real response (flagged CONTEXT), a rehearsed one
    (REHEARSE, or more act tokens), act; and their [n, 2] advantages."""
    g = torch.Generator().manual_seed(seed)
    eps = []
    for i in range(n):
        k = 3 + i % 3  # real-response length
        roles = ([CONTEXT] * 4 + [ACT] * 3 + [CONTEXT] * 2 + [CONTEXT] * k
                 + [REHEARSE if rehearse else ACT] * 4 + [ACT] * 3)
        real = [False] * 9 + [True] * k + [False] * 7
        ids = torch.randint(1, 61, (len(roles),), generator=g).tolist()
        lp = [0.0 if r == CONTEXT else -float(torch.rand(1, generator=g)) * 4 for r in roles]
        eps.append(Episode(None, None, ids, roles, lp, [-1] * len(roles), 4, "finished", [],
                           real))
    return eps, torch.randn(n, 2, generator=g)


def _policy(cfg: TrainConfig, model: Any, world_model: Any = None) -> Any:
    from envace.training.train_setup import Policy, _optim

    pol = Policy(model, SimpleNamespace(pad_token_id=0), Path("."), world_model=world_model)
    for name, m, _ in pol.trainees(cfg.mode):
        pol.optimizers[name], pol.schedulers[name] = _optim(m, cfg)
    return pol


def _cfg(**kw: Any) -> TrainConfig:
    return TrainConfig(**{"lr": 1e-2, "group_size": 2, "prompts_per_step": 2,
                          "micro_batch_size": 2, "weight_decay": 0.0, **kw})


def _weights(m: Any) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in m.state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_update_reports_the_token_mean_cross_entropy_of_the_real_tokens():
    from envace.training.update import update

    eps, adv = _episodes(5)
    model = _qwen(0)
    manual, count = 0.0, 0
    with torch.no_grad():
        for e in eps:  # each episode alone, unpadded: log-softmax at the flagged targets
            ids = torch.tensor([e.ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            for t in range(1, len(e.ids)):
                if e.real_obs[t]:
                    manual -= float(logp[t - 1, e.ids[t]])
                    count += 1
    st = update(_policy(_cfg(mode="grpo", real_obs_coef=0.5), model), eps, adv,
                _cfg(mode="grpo", real_obs_coef=0.5))
    assert st["real_obs/tokens"] == count == sum(3 + i % 3 for i in range(5))
    assert st["loss/real_obs"] == pytest.approx(manual / count, rel=1e-5)
    assert "loss" in st and st["loss"] != pytest.approx(st["loss/real_obs"])  # logged apart


def test_zero_coefficient_leaves_the_update_bit_identical():
    """real_obs_coef=0 (the default): flagged tokens change nothing, weights or figures."""
    from envace.training.update import update

    eps, adv = _episodes(5)
    plain = [copy.copy(e) for e in eps]
    for e in plain:
        e.real_obs = []  # what the rollout gave before the flags existed
    for mode in ("grpo", "envace"):
        got = []
        for batch in (eps, plain):
            model = _qwen(0)
            cfg = _cfg(mode=mode)
            st = update(_policy(cfg, model), batch, adv, cfg)
            got.append((st, _weights(model)))
        assert got[0][0] == got[1][0] and _same(got[0][1], got[1][1])
        assert not any(k.startswith(("loss/real_obs", "real_obs/")) for k in got[0][0])


@pytest.mark.parametrize("mode", ["grpo", "envace", "split"])
def test_the_gradient_reaches_the_model_that_learns_the_world_only(mode):
    """Against the same update with the coefficient 0: the world learner's weights move (the
    world model in split, the policy in grpo/envace); every other trainee's are identical."""
    from envace.training.update import update

    extra = {"anchor_fraction": 0.5} if training_mode(mode).rollout == "rehearse" else {}
    eps, adv = _episodes(4, rehearse=mode != "grpo")
    after = {}
    for coef in (0.0, 1.0):
        cfg = _cfg(mode=mode, real_obs_coef=coef, **extra)
        models = {"policy": _qwen(0), "world_model": _qwen(1) if mode == "split" else None}
        update(_policy(cfg, models["policy"], models["world_model"]), eps, adv, cfg)
        after[coef] = {n: _weights(m) for n, m in models.items() if m is not None}
    learner = training_mode(mode).world_learner
    assert learner == {"grpo": "policy", "envace": "policy", "split": "world_model"}[mode]
    for name in after[0.0]:
        assert _same(after[0.0][name], after[1.0][name]) == (name != learner), name


def test_a_world_model_with_only_real_tokens_still_learns():
    """Mode split, a batch of anchored groups only (no rehearsal to train): the world model
    steps on the real-response loss alone, with finite figures."""
    from envace.training.update import update

    eps, adv = _episodes(4, rehearse=False)
    cfg = _cfg(mode="split", real_obs_coef=1.0, anchor_fraction=1.0)
    wm = _qwen(1)
    before = _weights(wm)
    st = update(_policy(cfg, _qwen(0), wm), eps, adv, cfg)
    assert not _same(before, _weights(wm))
    assert st["real_obs/tokens"] > 0 and st["loss/real_obs"] > 0
    assert st["world_model/entropy"] == 0.0 and st["world_model/loss"] == 0.0


# -- anchored groups -------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.floats(0, 1), st.integers(0, 10**6))
def test_anchored_groups_are_the_fraction_of_the_groups(n, fraction, seed):
    from envace.training.train import anchored_groups

    got = anchored_groups(random.Random(seed), n, fraction)
    assert len(got) == n
    assert int(fraction * n) <= sum(got) <= min(n, int(fraction * n) + 1)
    if float(fraction * n).is_integer():
        assert sum(got) == fraction * n


def test_anchored_groups_leave_the_step_unchanged_when_off():
    from envace.training.train import anchored_groups

    rng, fresh = random.Random(5), random.Random(5)
    assert anchored_groups(rng, 4, 0.0) == [False] * 4 and rng.random() == fresh.random()
    assert sum(anchored_groups(random.Random(1), 4, 0.5)) == 2


def test_anchored_groups_roll_out_in_reality_as_groups_of_their_own():
    from envace.training.train import ANCHOR_SEED, rollout_groups

    calls = []

    def fake(model, tok, tasks, cfg, simulator, world_model, timer=None):
        calls.append((list(tasks), cfg.mode, cfg.seed, simulator, world_model))
        return [(t, cfg.mode) for t in tasks]

    pol = SimpleNamespace(model="m", tokenizer="t", simulator="sim", world_model="wm",
                          run_episodes=fake)
    groups = [("a", False), ("b", True), ("c", False), ("d", True)]
    eps = rollout_groups(pol, groups, 2, RolloutConfig(mode="rehearse", seed=9))
    assert eps == [("a", "rehearse")] * 2 + [("b", "real")] * 2 + [("c", "rehearse")] * 2 \
        + [("d", "real")] * 2
    assert calls == [(["a", "a", "c", "c"], "rehearse", 9, "sim", "wm"),
                     (["b", "b", "d", "d"], "real", 9 + ANCHOR_SEED, None, None)]
    calls.clear()  # nothing anchored: the one call the step made before
    rollout_groups(pol, [("a", False)], 2, RolloutConfig(mode="rehearse", seed=9))
    assert calls == [(["a", "a"], "rehearse", 9, "sim", "wm")]


# -- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides,message", [
    (["mode=grpo", "real_obs_coef=-0.1"], "real_obs_coef=-0.1: set real_obs_coef >= 0"),
    (["anchor_fraction=1.5"], r"anchor_fraction=1.5: set anchor_fraction in \[0, 1\]"),
    (["anchor_fraction=-0.5"], r"anchor_fraction=-0.5: set anchor_fraction in \[0, 1\]"),
    (["real_obs_coef=0.5"], "mode=envace with anchor_fraction=0 has none .*rehearsed.*"
                            "set anchor_fraction > 0, mode=grpo or real_obs_coef=0"),
    (["mode=split", "real_obs_coef=0.5"], "mode=split with anchor_fraction=0 has none"),
    (["mode=simulator", "simulator_model=tiny", "real_obs_coef=0.5"],
     r"has none \(its responses are simulated\): set mode=grpo or real_obs_coef=0"),
    (["mode=grpo", "anchor_fraction=0.5"], "mode=grpo does not rehearse.*anchor_fraction=0 or "
                                           "mode=envace/split"),
])
def test_config_checks_say_why(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(TrainConfig, None, overrides)


def test_config_accepts_real_observations_where_there_are_some():
    for name, mode in TRAINING_MODES.items():
        extra = ["simulator_model=tiny"] if mode.rollout == "simulator" else []
        if mode.rollout == "real":
            assert load_config(TrainConfig, None, [f"mode={name}", "real_obs_coef=0.5"])
        if mode.rollout == "rehearse":
            cfg = load_config(TrainConfig, None, [f"mode={name}", *extra, "real_obs_coef=0.5",
                                                  "anchor_fraction=0.25"])
            assert (cfg.real_obs_coef, cfg.anchor_fraction) == (0.5, 0.25)
    text = " ".join(config_help(TrainConfig).split())
    assert "real_obs_coef (float, default 0.0, >= 0)" in text and "loss/real_obs" in text
    assert "anchor_fraction (float, default 0.0, in [0, 1])" in text


# -- the trainer, end to end -----------------------------------------------------------------


def _train(tmp_path: Path, name: str, *args: str) -> list[dict]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([sys.executable, "-m", "envace.cli", "train", "--config",
                        str(ROOT / "configs" / "tiny.yaml"), f"output_dir={tmp_path}",
                        f"run_name={name}", "steps=1", "prompts_per_step=2", "group_size=2",
                        "eval_tasks=1", "max_new_tokens=48", "max_turns=2", "--quiet", *args],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_train_smoke_grpo_with_the_real_observation_loss(tmp_path):
    row, = _train(tmp_path, "grpo", "mode=grpo", "real_obs_coef=0.5")
    assert "loss" in row and "episodes/anchored" not in row
    assert row["real_obs/tokens"] > 0 and row["loss/real_obs"] > 0  # seeded: the calls are made


def test_train_smoke_envace_anchors_half_the_groups_in_reality(tmp_path):
    row, = _train(tmp_path, "anchored", "mode=envace", "anchor_fraction=0.5",
                  "real_obs_coef=0.5")
    assert row["episodes/anchored"] == 2  # one of the two groups, group_size 2
    trajs = [json.loads(x) for x in
             (tmp_path / "anchored" / "rollouts" / "step_0.jsonl").read_text().splitlines()]
    sources = [t["source"] for t in trajs]
    assert sorted(sources) == ["real", "real", "rehearsal", "rehearsal"]
    # groups are homogeneous: both members of a group were answered alike
    by_group: dict[str, set] = {}
    for t in trajs:
        by_group.setdefault(t["meta"]["group"], set()).add(t["source"])
    assert sorted(len(s) for s in by_group.values()) == [1, 1]
    assert "real_obs/tokens" in row and "loss/real_obs" in row
    # the dashboard's Training page draws the new keys with no code of its own
    from tests.dashboard.test_dashboard import charts, open_page

    with pytest.MonkeyPatch.context() as mp:
        shown = charts(open_page(mp, tmp_path, "training", run="anchored"))
    assert set(shown["Loss"][0]["metric"]) >= {"loss", "loss/real_obs"}
    assert "real_obs/tokens" in set(shown["real_obs"][0]["metric"])
    assert "episodes/anchored" in set(shown["episodes"][0]["metric"])
