"""Data parallelism: sharding is undone exactly, a two-process update (replicated or FSDP)
equals the one-process update on the whole batch, and `envace train` runs, checkpoints and
resumes on two launched CPU processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from envace.model.rollout import ACT, CONTEXT, REHEARSE, Episode
from envace.training.config import TrainConfig
from envace.training.distributed import Dist, merge_shards
from envace.training.train_setup import Policy, _optim
from envace.training.update import update

ROOT = Path(__file__).resolve().parents[2]


@given(st.lists(st.integers(), max_size=40), st.integers(min_value=1, max_value=6))
def test_shards_merge_back_in_order(items, world):
    parts = [Dist(rank, world).shard(items) for rank in range(world)]
    assert sum(len(p) for p in parts) == len(items)
    assert merge_shards(parts) == items


def test_one_process_is_the_identity():
    d = Dist()
    assert d.is_main and not d.active
    assert d.sum(2.5) == 2.5
    assert d.gather_ordered([1, 2, 3]) == [1, 2, 3]


# -- two real processes over gloo -------------------------------------------------------------

def _model(seed: int = 0) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      max_position_embeddings=128)
    return Qwen3ForCausalLM(cfg)


def _episodes(n: int, seed: int = 1) -> tuple[list[Episode], torch.Tensor]:
    """Synthetic episodes (a stand-in for rollouts: `update` reads only ids, roles, log-probs)."""
    g = torch.Generator().manual_seed(seed)
    eps = []
    for i in range(n):
        length = 12 + 5 * (i % 3)
        ids = torch.randint(1, 61, (length,), generator=g).tolist()
        roles = [CONTEXT] * 4 + [ACT if (k // 3) % 2 == 0 else REHEARSE for k in range(length - 4)]
        logprobs = [0.0] * 4 + (-torch.rand(length - 4, generator=g) * 4).tolist()
        eps.append(Episode(None, None, ids, roles, logprobs, [-1] * length, 4, "finished", []))
    return eps, torch.randn(n, 2, generator=g)


def _policy(model: torch.nn.Module, cfg: TrainConfig) -> Policy:
    pol = Policy(model, SimpleNamespace(pad_token_id=0), Path("."))
    pol.optimizers["policy"], pol.schedulers["policy"] = _optim(model, cfg)
    return pol


CFG = dict(micro_batch_size=2, lr=1e-2, group_size=2, prompts_per_step=4)


def _worker(rank: int, world: int, port: int, out: str, aggregation: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    cfg = TrainConfig(**CFG, aggregation=aggregation)
    eps, adv = _episodes(8)
    dist = Dist(rank, world)
    groups = [list(range(k, k + 2)) for k in range(0, 8, 2)]
    mine = [i for grp in dist.shard(groups) for i in grp]
    model = _model()
    stats = update(_policy(model, cfg), [eps[i] for i in mine], adv[mine], cfg, dist)
    grads = {n: q.grad.clone() for n, q in model.named_parameters()}
    torch.save({"state": model.state_dict(), "grads": grads, "stats": stats},
               f"{out}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_two_process_update_equals_one_process_update(tmp_path, aggregation):
    cfg = TrainConfig(**CFG, aggregation=aggregation)
    eps, adv = _episodes(8)
    model = _model()
    want = update(_policy(model, cfg), eps, adv, cfg)
    torch.multiprocessing.spawn(_worker, args=(2, _free_port(), str(tmp_path), aggregation),
                                nprocs=2, join=True)
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for name, p in model.named_parameters():
        # the gradient each replica stepped with is the one of the whole batch (AdamW's first
        # step is ~lr * sign(g), so weights are compared between replicas, not with `model`)
        for g in got:
            assert torch.allclose(g["grads"][name], p.grad, rtol=1e-4, atol=1e-8), name
        assert torch.equal(got[0]["state"][name], got[1]["state"][name]), name
        assert p.grad.abs().sum() > 0 or "norm" in name
    for k in ("loss", "pg_loss", "entropy", "grad_norm"):
        assert got[0]["stats"][k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), k
        assert got[1]["stats"][k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), k


# -- accelerate launch, end to end ------------------------------------------------------------

def _tiny(tmp_path: Path) -> Path:
    from envace.core.envs.bfcl.tasks import split_tasks
    from envace.core.export import export_real
    from envace.model import chat
    from envace.model.models import build_tiny

    texts = [chat.render([m.dump() for m in t.messages], t.tools)
             for t in export_real(split_tasks("train")[:40])]
    return build_tiny(texts, tmp_path / "tiny", seed=0)


def test_torchrun_trains_on_two_processes(tmp_path):
    """Two CPU processes (gloo) through torchrun, the launcher `accelerate launch` wraps on GPUs
    (accelerate itself launches several CPU processes only through mpirun)."""
    model_dir = _tiny(tmp_path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(_free_port()), "-m", "envace.cli", "train",
           "--config", str(ROOT / "configs" / "tiny.yaml"), f"model={model_dir}",
           f"output_dir={tmp_path / 'runs'}", "run_name=ddp", "steps=2", "prompts_per_step=2",
           "group_size=2", "max_new_tokens=8", "max_turns=2", "eval_tasks=2",
           "checkpoint_every=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "runs" / "ddp"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]  # written once, by rank 0
    assert all(m["ranks"] == 2 for m in metrics)
    for step in (0, 1):  # each step's file holds both ranks' groups: 2 prompts x 2
        lines = (run / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
        assert len(lines) == 4
        groups = [json.loads(x)["meta"]["group"] for x in lines]
        assert groups[0] == groups[1] and groups[2] == groups[3] and groups[0] != groups[2]
    assert (run / "report.md").exists() and not (run / "RUNNING").exists()
    assert (run / "checkpoints" / "step_1").is_dir()
    assert res.stdout.count("[train] step 1/2") == 1  # progress from rank 0 only


def test_accelerates_fsdp_config_selects_sharding(monkeypatch):
    from envace.training.distributed import init, wants_fsdp

    assert not wants_fsdp() and wants_fsdp("fsdp")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert wants_fsdp()
    assert init("fsdp") == Dist()  # one process: nothing to shard


# -- FSDP: sharded twins ----------------------------------------------------------------------

def _fsdp_worker(rank: int, world: int, port: int, out: str) -> None:
    from envace.training.fsdp import full_state, shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    cfg = TrainConfig(**CFG)
    eps, adv = _episodes(6)
    dist = Dist(rank, world, fsdp=True)
    # three groups over two ranks: rank 0 has two micro-batches, rank 1 one (it idles once)
    groups = [list(range(k, k + 2)) for k in range(0, 6, 2)]
    mine = [i for grp in dist.shard(groups) for i in grp]
    model = _model()
    pol = Policy(model, SimpleNamespace(pad_token_id=0), Path("."))
    pol.sharded["policy"] = twin = shard(model, dist)
    pol.optimizers["policy"], pol.schedulers["policy"] = _optim(twin, cfg)
    stats = update(pol, [eps[i] for i in mine], adv[mine], cfg, dist)
    grads = {n: q.grad.full_tensor() for n, q in twin.named_parameters()}
    local = sum(q.grad.to_local().numel() for q in twin.parameters())
    whole = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save({"state": whole, "twin": full_state(twin), "grads": grads, "stats": stats,
                "local": local}, f"{out}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


def test_fsdp_update_equals_one_process_update(tmp_path):
    cfg = TrainConfig(**CFG)
    eps, adv = _episodes(6)
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    want = update(_policy(model, cfg), eps, adv, cfg)
    torch.multiprocessing.spawn(_fsdp_worker, args=(2, _free_port(), str(tmp_path)),
                                nprocs=2, join=True)
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    n_params = sum(p.numel() for p in model.parameters())
    for g in got:  # each rank holds about half of the gradients (and so of AdamW's state)
        assert g["local"] <= n_params // 2 + 64
    for name, p in model.named_parameters():
        for g in got:
            assert torch.allclose(g["grads"][name], p.grad, rtol=1e-4, atol=1e-8), name
            # the whole (generating) model was refreshed from the stepped shards
            assert torch.equal(g["state"][name], g["twin"][name]), name
            assert not torch.equal(g["state"][name], before[name]) or p.grad.abs().sum() == 0
        assert torch.equal(got[0]["state"][name], got[1]["state"][name]), name
    for k in ("loss", "pg_loss", "entropy", "grad_norm"):
        for g in got:
            assert g["stats"][k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), k


def test_torchrun_fsdp_trains_checkpoints_and_resumes(tmp_path):
    """`envace train sharding=fsdp` on two CPU processes: the optimizer state is gathered into
    the checkpoint, and a resumed run loads it back into its shards and carries on."""
    model_dir = _tiny(tmp_path)
    base = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_port", str(_free_port()), "-m", "envace.cli", "train"]
    args = ["--config", str(ROOT / "configs" / "tiny.yaml"), f"model={model_dir}",
            f"output_dir={tmp_path / 'runs'}", "run_name=fsdp", "sharding=fsdp",
            "prompts_per_step=2", "group_size=2", "max_new_tokens=8", "max_turns=2",
            "eval_tasks=2", "checkpoint_every=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([*base, *args, "steps=1"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "runs" / "fsdp"
    ckpt = run / "checkpoints" / "step_0"
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)["optimizers"]["policy"]
    moments = state["state"]["model.embed_tokens.weight"]["exp_avg"]
    assert moments.shape[0] == json.loads((ckpt / "policy" / "config.json").read_text())[
        "vocab_size"]  # the whole state, not one rank's shard
    res = subprocess.run([*base, "--resume", str(run), "steps=2"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1] and metrics[1]["ranks"] == 2
    assert (run / "checkpoints" / "step_1").is_dir() and (run / "report.md").exists()
    assert "sharding: fsdp" in (run / "config.yaml").read_text()
