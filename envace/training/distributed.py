"""Data-parallel training over several processes (``accelerate launch`` or ``torchrun``).

    accelerate launch --config_file configs/accelerate/ddp.yaml -m envace.cli train ...
    accelerate launch --config_file configs/accelerate/fsdp.yaml -m envace.cli train ...
    python -m torch.distributed.run --nproc_per_node 2 -m envace.cli train ...   # CPU processes

Each rank holds a full replica. It rolls out its own share of the step's prompt groups (a group
never straddles ranks, so its advantages are computed where its episodes are), takes the loss of
its share over the *global* token (or sequence) count, and the gradients are summed across ranks
before the optimizer step: the update is the one-process update on the whole batch, and the
replicas stay identical. With ``sharding=fsdp`` (or accelerate's FSDP config) the trained
models are sharded instead (``envace.training.fsdp``): same update, 1/world of the training state
per rank. Rank 0 gathers the episodes and writes everything (metrics, rollouts, audits, checkpoints,
evaluation, report); the other ranks only compute.

One process (no ``WORLD_SIZE`` in the environment) is the trivial case: every operation here is
then the identity. Process setup is accelerate's (``PartialState``: backend nccl on GPUs, gloo
on CPU).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

T = TypeVar("T")


@dataclass(frozen=True)
class Dist:
    """This process's place in the job."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    fsdp: bool = False  # trained models sharded (envace.training.fsdp) rather than replicated

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's share: items rank, rank + world, ... (the order of ``gather_ordered``)."""
        return list(items[self.rank::self.world])

    def sum(self, x: float) -> float:
        """The sum of ``x`` over ranks."""
        if not self.active:
            return float(x)
        t = torch.tensor([float(x)], dtype=torch.float64, device=self._device())
        torch.distributed.all_reduce(t)
        return float(t.item())

    def max(self, x: int) -> int:
        """The largest ``x`` over ranks."""
        if not self.active:
            return int(x)
        t = torch.tensor([int(x)], dtype=torch.int64, device=self._device())
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t.item())

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (on every rank)."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def gather_ordered(self, items: list[T]) -> list[T]:
        """Undo ``shard``: the items of all ranks back in their original order."""
        return merge_shards(self.gather(items))

    def sum_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum the gradients over ranks (a parameter without a gradient counts as zeros), in
        one flat buffer: one collective per call."""
        if not self.active:
            return
        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = torch._utils._flatten_dense_tensors(grads)
        torch.distributed.all_reduce(flat)
        for g, new in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
            g.copy_(new)

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def device(self) -> torch.device:
        """Where this rank's model lives: its own GPU, or the CPU."""
        return self._device()

    def _device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")


def merge_shards(parts: Sequence[Sequence[T]]) -> list[T]:
    """The inverse of sharding (rank r holds items r, r + world, ...)."""
    world = len(parts)
    out: list[T] = [None] * sum(len(p) for p in parts)  # type: ignore[list-item]
    for r, part in enumerate(parts):
        out[r::world] = part
    return out


def wants_fsdp(sharding: str = "replicate") -> bool:
    """Shard the trained models? ``sharding=fsdp``, or launched with accelerate's FSDP config."""
    return sharding == "fsdp" or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"


def init(sharding: str = "replicate") -> Dist:
    """The process group of a launched job (accelerate / torchrun), or one process (where
    sharding is moot: FSDP over one rank is a full replica)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Dist()
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())
    return Dist(state.process_index, state.num_processes, state.local_process_index,
                fsdp=wants_fsdp(sharding))


__all__ = ["Dist", "init", "merge_shards", "wants_fsdp"]
