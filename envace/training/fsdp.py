"""Sharded training (FSDP2, ``torch.distributed.fsdp.fully_shard``) for models too big to hold
a full replica of weights, gradients and optimizer state on every rank.

    accelerate launch --config_file configs/accelerate/fsdp.yaml -m envace.cli train ...
    python -m torch.distributed.run --nproc_per_node 2 -m envace.cli train sharding=fsdp ...

Each trained model gets a *sharded twin*: every decoder layer and the root are wrapped with
``fully_shard``, so each rank keeps 1/world of the parameters, gradients and AdamW state; the
loss and backward run on the twin. Generation cannot: ranks roll out different episodes, so
their forwards do not line up and a sharded forward (which all-gathers) would deadlock. Rollouts
and evaluation therefore use the plain model, a full copy the trainer refreshes from the twin
after every optimizer step (one all-gather), the same way weights are pushed to vLLM. Memory per
rank: one full copy of the weights for generation plus 1/world of the training state.

FSDP averages gradients over ranks; the trainer's loss is already normalised by the global
count, so the backward is scaled by the world size to get the sum (exact, tested against one
process on the whole batch). Every rank must run the same number of forwards and backwards: a
rank with fewer micro-batches runs zero-weight ones (``idle_backward``).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from envace.training.distributed import Dist


def layer_classes(model: torch.nn.Module) -> tuple[type, ...]:
    """The repeated block classes to shard one by one (transformers' ``_no_split_modules``)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    found = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not found:
        raise ValueError(f"{type(model).__name__} names no decoder-layer class "
                         "(_no_split_modules): cannot shard it layer by layer")
    return tuple(found)


def shard(model: torch.nn.Module, dist: Dist) -> torch.nn.Module:
    """A sharded twin of ``model`` (a deep copy: ``model`` itself stays whole, for generation)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    twin = copy.deepcopy(model)
    mesh = init_device_mesh(dist.device().type, (dist.world,))
    blocks = layer_classes(twin)
    for m in list(twin.modules()):
        if isinstance(m, blocks):
            fully_shard(m, mesh=mesh)
    fully_shard(twin, mesh=mesh)
    twin.train(model.training)
    return twin


def full_state(twin: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The twin's whole weights on every rank (collective: every rank must call it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(twin, options=StateDictOptions(full_state_dict=True))


@torch.no_grad()
def refresh(model: torch.nn.Module, twin: torch.nn.Module) -> None:
    """Copy the twin's weights into the whole model, in place (collective), one parameter at a
    time: no second whole copy is ever held. The twin is a deep copy of ``model``, so their
    parameters have the same names (tied ones listed once in both)."""
    own = dict(model.named_parameters())
    for name, p in twin.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        own[name].copy_(full.to(own[name].device, own[name].dtype))
        del full


def optimizer_state(twin: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's whole state, keyed by parameter name, on rank 0 (collective; the other
    ranks get an empty dict)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    return get_optimizer_state_dict(
        twin, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(twin: torch.nn.Module, opt: torch.optim.Optimizer,
                         state: dict[str, Any]) -> None:
    """Restore a whole optimizer state (from ``optimizer_state``) into this rank's shard."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    set_optimizer_state_dict(twin, opt, optim_state_dict=state,
                             options=StateDictOptions(full_state_dict=True))


def idle_backward(twin: torch.nn.Module, pad_id: int) -> None:
    """A forward and backward of weight zero: keeps this rank in step with ranks that have
    more micro-batches (each sharded forward and backward is a collective)."""
    dev = next(twin.parameters()).device
    ids = torch.full((1, 2), pad_id, dtype=torch.long, device=dev)
    (twin(input_ids=ids).logits.float().sum() * 0.0).backward()


def grad_norm_value(norm: torch.Tensor) -> float:
    """clip_grad_norm_'s result as a float (a DTensor under FSDP)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


__all__ = ["full_state", "grad_norm_value", "idle_backward", "layer_classes",
           "load_optimizer_state", "optimizer_state", "refresh", "shard"]
