"""Decode-time linear layers on weights prepacked once for oneDNN (CPU, fp32 or bf16).

At a few rows per call (one token per episode of a decode batch) ``F.linear`` on CPU packs the
whole weight matrix into the GEMM kernel's blocked layout again at every call, so a layer reads
and writes its weights before it multiplies. oneDNN can pack a weight once
(``torch.ops.mkldnn._reorder_linear_weight``) and multiply against the packed copy
(``torch.ops.mkldnn._linear_pointwise``, what inductor's CPU freezing pass emits). On the
SmolLM2 shapes at 8 rows, weights cold in cache, one thread (``bench/decode_profile.py``):
the 49,152 x 576 LM head 2.7x faster, the 1536 x 576 layers 1.5x.

    packs = PackedLinears(model)
    with packs.active():              # every nn.Linear of `model` for the duration
        out = model(input_ids=...)    # no_grad, CPU, fp32/bf16: the packed kernel

The packed copies live only as long as the ``PackedLinears``, which ``HFStepper`` makes for one
rollout (one ``run_episodes`` or ``generate`` call): no update happens inside one, so a policy
that trains between rollouts is packed afresh each time. Each call also compares the weight's
storage, version counter and shape with its copy's and repacks when they differ (a load or a
``copy_`` bumps the counter; a fused optimizer step or a write through ``.data`` does not, which
is why the copies are never kept across rollouts).
Calls that need gradients, or run on another device or dtype, take ``F.linear`` unchanged.
Memory: one more copy of the packed weights while a rollout decodes. The arithmetic is the same
product in another summation order: outputs differ from ``F.linear`` by float rounding
(``tests/model/test_packed_linear.py`` bounds it; recorded log-probabilities still equal a fresh
forward to ``tests/model/test_rollout.py``'s tolerance).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

_DTYPES = (torch.float32, torch.bfloat16)
# smaller weights stay on F.linear: a oneDNN call costs ~25 us more than MKL's, which a weight
# this small (1 MiB in fp32) does not win back when it sits in cache (the tiny preset's layers)
MIN_ELEMENTS = 1 << 18


def available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build and CPU have oneDNN's prepacked linear for `dtype`."""
    ops = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise")):
        return False
    if dtype == torch.bfloat16:
        return bool(getattr(ops, "_is_mkldnn_bf16_supported", lambda: False)())
    return dtype == torch.float32


class PackedLinears:
    """Packed copies of `model`'s ``nn.Linear`` weights and a context that decodes with them."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.layers = [m for m in model.modules() if type(m) is torch.nn.Linear
                       and m.weight.numel() >= MIN_ELEMENTS]
        self._packs: dict[int, tuple[tuple[int, int, tuple[int, ...]], torch.Tensor]] = {}
        self._ok = {dt: available(dt) for dt in _DTYPES}
        self.packed_calls = 0  # calls that took the packed kernel (tests, benchmarks)

    def usable(self, layer: torch.nn.Linear, x: torch.Tensor) -> bool:
        """Whether ``layer(x)`` can take the packed kernel (no grad, CPU, fp32/bf16)."""
        w = layer.weight
        return (not torch.is_grad_enabled() and w.device.type == "cpu"
                and x.device.type == "cpu" and w.dtype == x.dtype
                and self._ok.get(w.dtype, False) and x.dim() >= 2)

    def packed(self, layer: torch.nn.Linear) -> torch.Tensor:
        """`layer`'s weight packed for oneDNN, repacked if the weight changed since."""
        w = layer.weight
        key = (w.data_ptr(), w._version, tuple(w.shape))
        held = self._packs.get(id(layer))
        if held is None or held[0] != key:
            held = (key, torch.ops.mkldnn._reorder_linear_weight(w.detach(), 8))
            self._packs[id(layer)] = held
        return held[1]

    def forward(self, layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """``layer(x)``: through the packed weight where usable, else ``F.linear``."""
        if not self.usable(layer, x):
            return F.linear(x, layer.weight, layer.bias)
        self.packed_calls += 1
        return torch.ops.mkldnn._linear_pointwise(x, self.packed(layer), layer.bias,
                                                  "none", [], "")

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Inside the block every layer's ``forward`` is `forward` (layers that already carry
        an instance-level ``forward``, a hook of someone else's, are left alone); restored on
        exit, exception or not."""
        mine = [m for m in self.layers if "forward" not in m.__dict__]
        for m in mine:
            m.forward = self._bound(m)
        try:
            yield
        finally:
            for m in mine:
                m.__dict__.pop("forward", None)

    def _bound(self, layer: torch.nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda x: self.forward(layer, x)
