"""What sharding buys: training state per rank and update time, replicated against FSDP.

    .venv/bin/python -m bench.fsdp_memory [--model smollm2] [--world 2] [--steps 3]

Two real processes over gloo on this CPU run the trainer's ``update`` on the same synthetic
batch (episodes of random tokens with act / rehearse roles: this measures the optimizer step,
not rollouts), first with every rank holding a replica (``sharding=replicate``: gradients summed
by one all-reduce), then with the trained model sharded (``sharding=fsdp``:
``envace.training.fsdp``). Per rank it records the bytes of the training state it holds (trained
parameters, their gradients, AdamW's two moments), the bytes of the whole copy kept for generation
under FSDP, the process's RSS after the updates and its peak, and the median seconds per update; the
FSDP / replicate ratios are the figures. Writes bench/results/fsdp_memory.json.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from bench.machine import run_record, table, write_result


def _bytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def _episodes(n: int, length: int, vocab: int, seed: int = 1) -> tuple[list[Any], torch.Tensor]:
    from envace.model.rollout import ACT, CONTEXT, REHEARSE, Episode

    g = torch.Generator().manual_seed(seed)
    eps = []
    for _ in range(n):
        ids = torch.randint(1, vocab, (length,), generator=g).tolist()
        roles = [CONTEXT] * 16 + [ACT if (k // 8) % 2 == 0 else REHEARSE
                                  for k in range(length - 16)]
        lps = [0.0] * 16 + (-torch.rand(length - 16, generator=g) * 3).tolist()
        eps.append(Episode(None, None, ids, roles, lps, [-1] * length, 16, "finished", []))
    return eps, torch.randn(n, 2, generator=g)


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    from envace.model.models import default_cache_dir, load_model, resolve_model
    from envace.training.config import TrainConfig
    from envace.training.distributed import Dist
    from envace.training.fsdp import shard
    from envace.training.train_setup import Policy, _optim
    from envace.training.update import update

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    fsdp = args.sharding == "fsdp"
    dist = Dist(rank, world, fsdp=fsdp)
    model, _ = load_model(resolve_model(args.model, default_cache_dir()))
    cfg = TrainConfig(micro_batch_size=args.micro_batch, lr=1e-5, group_size=2,
                      prompts_per_step=args.episodes // 2)
    pol = Policy(model, SimpleNamespace(pad_token_id=0), Path("."))
    trained = shard(model, dist) if fsdp else model
    if fsdp:
        pol.sharded["policy"] = trained
    pol.optimizers["policy"], pol.schedulers["policy"] = _optim(trained, cfg)
    eps, adv = _episodes(args.episodes, args.length, model.config.vocab_size)
    groups = [list(range(k, k + 2)) for k in range(0, args.episodes, 2)]
    mine = [i for grp in dist.shard(groups) for i in grp]
    times = []
    for _ in range(args.steps):
        dist.barrier()
        t = time.perf_counter()
        update(pol, [eps[i] for i in mine], adv[mine], cfg, dist)
        times.append(time.perf_counter() - t)
    params = sum(_bytes(p) for p in trained.parameters())
    grads = sum(_bytes(p.grad) for p in trained.parameters() if p.grad is not None)
    moments = sum(_bytes(v) for s in pol.optimizers["policy"].state.values()
                  for k, v in s.items() if k in ("exp_avg", "exp_avg_sq"))
    whole = sum(_bytes(p) for p in model.parameters()) if fsdp else 0
    import ctypes  # hand freed heap back first: RSS then counts live memory, not malloc's cache

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    torch.save({"params": params, "grads": grads, "moments": moments, "whole_copy": whole,
                "train_state": params + grads + moments, "rss_after_mib": rss / 2**20,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "seconds_per_update": sorted(times)[len(times) // 2]},
               f"{out}/{args.sharding}-rank{rank}.pt")
    torch.distributed.destroy_process_group()


def ratios(replicate: dict[str, float], fsdp: dict[str, float]) -> dict[str, float]:
    """FSDP over replicate for each figure of the busiest rank (state, RSS, peak, time)."""
    return {k: fsdp[k] / replicate[k] for k in ("train_state", "rss_after_mib", "peak_rss_mib",
                                                "seconds_per_update")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    out = tempfile.mkdtemp(prefix="envace-fsdp-bench-")
    res: dict[str, Any] = {k: getattr(args, k) for k in ("model", "world", "episodes", "length",
                                                           "micro_batch", "steps")}
    for sharding in ("replicate", "fsdp"):
        args.sharding = sharding
        torch.multiprocessing.spawn(_worker, args=(args.world, _free_port(), args, out),
                                    nprocs=args.world, join=True)
        ranks = [torch.load(Path(out) / f"{sharding}-rank{r}.pt") for r in range(args.world)]
        res[sharding] = {k: max(r[k] for r in ranks) for k in ranks[0]}  # the busiest rank
    rep, fs = res["replicate"], res["fsdp"]
    res["ratio_fsdp_over_replicate"] = ratios(rep, fs)
    mib = 2**20
    rows = [[s, f"{res[s]['train_state'] / mib:.0f}", f"{res[s]['whole_copy'] / mib:.0f}",
             f"{res[s]['rss_after_mib']:.0f}", f"{res[s]['peak_rss_mib']:.0f}",
             f"{res[s]['seconds_per_update']:.2f}"] for s in ("replicate", "fsdp")]
    ratio = res["ratio_fsdp_over_replicate"]
    rows.append(["fsdp / replicate", f"{ratio['train_state']:.2f}", "–",
                 *(f"{ratio[k]:.2f}" for k in ("rss_after_mib", "peak_rss_mib",
                                                "seconds_per_update"))])
    print(table(rows, ["sharding", "training state / rank (MiB)", "whole copy for generation "
                       "(MiB)", "RSS after the updates (MiB)", "peak RSS / rank (MiB)",
                       "s / update"]))
    print("->", write_result("fsdp_memory", {**res, **run_record("bench.fsdp_memory", argv,
                                                                load_start)}))


if __name__ == "__main__":
    main()
