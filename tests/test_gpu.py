"""Correctness on a CUDA device: rollout log-probs, a role-wise GRPO update, split rollouts, a
save/resume round trip. Marked ``gpu``: skipped without CUDA.

    python -m pytest -m gpu tests/test_gpu.py                              # on a GPU machine
    ENVACE_GPU_TESTS_ON_CPU=1 python -m pytest -m gpu tests/test_gpu.py    # rehearsal on a CPU

``scripts/gpu_check.sh`` runs these on the lent GPU (and, with ``--cpu-dry-run``, rehearses
them on the CPU, which is how the normal suite keeps them from rotting). Each test records what
it measured (``record_property``: the check's JSON carries it). Tolerances on the log-probs of
generated tokens, recorded (cached, batched, left-padded rollout) against a fresh forward (the
trainer's right-padded batch): fp32 max |diff| <= 1e-3 (the CPU test holds 2e-4; GPU kernels
reduce in other orders); bf16 mean |diff| <= 0.05 and max <= 0.5 (bf16 keeps 8 bits of
mantissa: a cached and a whole-sequence forward round differently).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from envace.core.envs.bfcl.tasks import get_task
from envace.core.envs.bfcl.turns import derive_turn_task
from envace.model.models import load_model
from envace.model.rollout import ACT, CONTEXT, REHEARSE, RolloutConfig, run_episodes
from envace.training import grpo
from envace.training.config import TrainConfig
from envace.training.train_setup import Policy, _optim
from envace.training.update import update

TINY_SFT = Path(__file__).resolve().parents[1] / "data" / "models" / "tiny-sft"
TOL = {"float32": {"max": 1e-3}, "bfloat16": {"mean": 0.05, "max": 0.5}}


def _device() -> str | None:
    if torch.cuda.is_available():
        return "cuda"
    return "cpu" if os.environ.get("ENVACE_GPU_TESTS_ON_CPU") == "1" else None


DEVICE = _device()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    DEVICE is None, reason="no CUDA device (ENVACE_GPU_TESTS_ON_CPU=1 rehearses on the CPU)")]


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    model, tok = load_model(TINY_SFT)
    return model.to(DEVICE), tok


def _tasks() -> list[Any]:
    """Prompts of different lengths (left padding) and one prompt three times (rows that
    share their prefill, then part)."""
    b1 = get_task("multi_turn_base_1")
    return [derive_turn_task(get_task("multi_turn_base_0"), 1), b1,
            get_task("multi_turn_base_10"), b1, b1]


def _rollouts(model: Any, tok: Any, seed: int, world_model: Any = None, tasks: Any = None
              ) -> tuple[list[Any], RolloutConfig]:
    """Rehearsed rollouts in which something was rehearsed: an untrained model often writes a
    malformed call first, and the device's sampling stream differs from the CPU's, so seeds
    are tried in turn (at most 8)."""
    for k in range(8):
        cfg = RolloutConfig(mode="rehearse", max_new_tokens=24, max_turns=2, max_context=3000,
                            seed=seed + 100 * k, temperature=1.0)
        eps = run_episodes(model, tok, tasks or _tasks(), cfg, world_model=world_model)
        if sum(e.tokens(REHEARSE) for e in eps) > 0:
            return eps, cfg
    raise AssertionError("8 seeds and nothing was rehearsed")


def _fresh_logprobs(model: Any, episodes: list[Any], temperature: float) -> list[torch.Tensor]:
    """Each token's log-prob under a fresh forward, computed as the trainer does: one
    right-padded batch, logits / temperature in fp32."""
    dev = next(model.parameters()).device
    width = max(len(e.ids) for e in episodes)
    ids = torch.zeros(len(episodes), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, e in enumerate(episodes):
        ids[i, :len(e.ids)] = torch.tensor(e.ids)
        attn[i, :len(e.ids)] = 1
    ids, attn = ids.to(dev), attn.to(dev)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float() / temperature
        lp = grpo.logprobs_from_logits(logits, ids[:, 1:])
    return [lp[i, :len(e.ids) - 1].cpu() for i, e in enumerate(episodes)]


def _diffs(model: Any, episodes: list[Any], roles: tuple[int, ...], temperature: float
           ) -> torch.Tensor:
    """|recorded - fresh| over the generated tokens of these roles, all episodes."""
    out = []
    for e, fresh in zip(episodes, _fresh_logprobs(model, episodes, temperature), strict=True):
        pos = [i for i, r in enumerate(e.roles) if r in roles and i > 0]
        if pos:
            got = torch.tensor([e.logprobs[i] for i in pos])
            out.append((got - fresh[torch.tensor(pos) - 1]).abs())
    assert out, "nothing was generated"
    return torch.cat(out)


def _check(d: torch.Tensor, dtype: str) -> None:
    assert torch.isfinite(d).all()
    tol = TOL[dtype]
    assert float(d.max()) <= tol["max"], (dtype, float(d.max()))
    if "mean" in tol:
        assert float(d.mean()) <= tol["mean"], (dtype, float(d.mean()))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_recorded_logprobs_equal_a_fresh_forward(tiny, dtype, record_property):
    """The engine's cached, batched, left-padded rollouts record the log-probs a fresh forward
    gives (the PPO ratio is 1 before the first update), in fp32 and in bf16."""
    model, tok = tiny
    model = copy.deepcopy(model).to(getattr(torch, dtype))
    eps, cfg = _rollouts(model, tok, seed=1)
    assert len({len(e.ids) for e in eps}) > 1, "rows should differ in length"
    d = _diffs(model, eps, (ACT, REHEARSE), cfg.temperature)
    record_property(f"logprob_max_abs_diff_{dtype}", float(d.max()))
    record_property(f"logprob_mean_abs_diff_{dtype}", float(d.mean()))
    record_property(f"generated_tokens_{dtype}", int(d.numel()))
    _check(d, dtype)
    assert all(e.logprobs[i] == 0.0 for e in eps for i, r in enumerate(e.roles) if r == CONTEXT)


def _policy(model: Any, cfg: TrainConfig, world_model: Any = None) -> Policy:
    pol = Policy(model=model, tokenizer=SimpleNamespace(pad_token_id=0, eos_token_id=0),
                 path=Path("tiny-sft"), world_model=world_model)
    for name, m, _ in pol.trainees(cfg.mode):
        m.train()
        pol.optimizers[name], pol.schedulers[name] = _optim(m, cfg)
    return pol


def test_grpo_update_on_the_device_matches_the_cpu(tiny, record_property):
    """One role-wise GRPO update on the device's rollouts: the same loss, entropy and gradient
    norm as the same update on the CPU (fp32); the weights move and stay finite; AdamW's state
    lives beside the weights."""
    model, tok = tiny
    cfg = TrainConfig(mode="envace", micro_batch_size=2, lr=1e-3, group_size=2,
                      prompts_per_step=2)
    dev_model = copy.deepcopy(model)
    eps, _ = _rollouts(dev_model, tok, seed=2, tasks=_tasks()[:4])
    rewards = torch.tensor([[1.0, 0.5], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    has = torch.tensor([[e.tokens(ACT) > 0, e.tokens(REHEARSE) > 0] for e in eps])
    adv = grpo.role_advantages(rewards, [0, 0, 1, 1], has).float()
    before = {k: v.detach().clone() for k, v in dev_model.state_dict().items()}
    pol = _policy(dev_model, cfg)
    on_dev = update(pol, eps, adv, cfg)
    on_cpu = update(_policy(copy.deepcopy(model).cpu(), cfg), eps, adv, cfg)
    for k in ("loss", "entropy", "grad_norm", "ratio_mean"):
        record_property(f"update_{k}_device", on_dev[k])
        assert on_dev[k] == pytest.approx(on_cpu[k], rel=1e-3, abs=1e-5), k
    assert on_dev["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    after = dev_model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in after)
    assert all(torch.isfinite(v).all() for v in after.values())
    assert next(dev_model.parameters()).device.type == DEVICE
    state = pol.optimizers["policy"].state
    assert state and all(s["exp_avg"].device.type == DEVICE for s in state.values())


def test_split_rollouts_use_each_model_on_the_device(tiny, record_property):
    """Mode split: the world model writes the rehearsals, the policy acts, both on the device;
    each role's recorded log-probs are its own model's; an update trains both."""
    model, tok = tiny
    policy = copy.deepcopy(model)
    wm = copy.deepcopy(model)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in wm.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    eps, rcfg = _rollouts(policy, tok, seed=4, world_model=wm)
    d_act = _diffs(policy, eps, (ACT,), rcfg.temperature)
    d_reh = _diffs(wm, eps, (REHEARSE,), rcfg.temperature)
    record_property("split_act_max_abs_diff", float(d_act.max()))
    record_property("split_rehearse_max_abs_diff", float(d_reh.max()))
    _check(d_act, "float32")
    _check(d_reh, "float32")
    # the other model would not have written them: the world model's tokens are its own
    assert float(_diffs(policy, eps, (REHEARSE,), rcfg.temperature).max()) > 1e-2
    cfg = TrainConfig(mode="split", micro_batch_size=2, lr=1e-3, group_size=5,
                      prompts_per_step=1)
    has = torch.tensor([[e.tokens(ACT) > 0, e.tokens(REHEARSE) > 0] for e in eps])
    adv = grpo.role_advantages(torch.tensor([[1.0, 1.0], [0, 0], [1, 0], [0, 1], [0, 0]]),
                               [0] * 5, has).float()
    w0 = copy.deepcopy(wm.state_dict())
    p0 = copy.deepcopy(policy.state_dict())
    st = update(_policy(policy, cfg, wm), eps, adv, cfg)
    assert "world_model/loss" in st
    assert any(not torch.equal(w0[k], v) for k, v in wm.state_dict().items())
    assert any(not torch.equal(p0[k], v) for k, v in policy.state_dict().items())


def test_checkpoint_resume_round_trip_on_the_device(tmp_path, record_property):
    """`envace train` on the device writes checkpoints; a resume puts the saved weights and
    AdamW state back on the device, exactly, and finishes the run."""
    import json

    from envace.training.checkpoint import load_latest
    from envace.training.train import train
    from envace.training.train_setup import build_policy

    # whole tasks: the pool of per-turn tasks takes half a minute to tokenize on a CPU
    base = dict(model=str(TINY_SFT), output_dir=str(tmp_path), run_name="rt", steps=1,
                prompts_per_step=2, group_size=2, max_new_tokens=16, max_turns=2,
                max_context_tokens=3072, checkpoint_every=1, eval_tasks=1, lr=1e-3,
                desc_chars=40, task_unit="task", reward="action")
    run = train(TrainConfig(**base), progress=False)
    state = load_latest(run)
    assert state is not None and state["step"] == 0
    pol = build_policy(TrainConfig(**base), run, state, progress=False)
    dev = next(pol.model.parameters()).device
    assert dev.type == DEVICE
    saved, _ = load_model(state["folder"] / "policy")
    for k, v in saved.state_dict().items():
        assert torch.equal(pol.model.state_dict()[k].cpu(), v), k
    opt_state = pol.optimizers["policy"].state
    assert opt_state, "AdamW state was not restored"
    for s in opt_state.values():
        assert s["exp_avg"].device == dev
    del pol
    run = train(TrainConfig(**{**base, "steps": 2}), resume=True, progress=False)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    record_property("resume_steps", len(rows))
    assert all(r["ratio_mean"] == pytest.approx(1.0, abs=0.05) for r in rows)
