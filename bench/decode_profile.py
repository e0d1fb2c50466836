"""Benchmark: what bounds one decode step (issue #18 item 2): a profile and the GEMMs alone.

    .venv/bin/python -m bench.decode_profile              # SmolLM2 + SFT, batch 8
    .venv/bin/python -m bench.decode_profile --model data/models/tiny-sft --batch 8

Two measurements on one thread, same model the rollout engine decodes with:

1. ``torch.profiler`` over ``--steps`` one-token steps of ``HFStepper`` (``--batch`` random prompts
   of about ``--prompt`` tokens, rows of different lengths so that the attention mask is a real
   one, the block-grown KV cache), with plain ``F.linear`` and with the oneDNN-packed linear
   layers the engine uses by default (``envace.model.backends.packed_linear``): the unprofiled
   time per step against the fp32 bandwidth ceiling, and the top ops by self CPU time per step;
2. every linear layer shape of the model at M = ``--batch`` rows (and at M = 2 for contrast),
   plain and packed, fp32 and bf16, against its floor: the weight bytes at this machine's copy
   bandwidth (``bench.rollout_engine.copy_bandwidth``). Each timing cycles through enough
   distinct weights (64 MiB) that every call reads its weight from memory, as a decode step does.
   A shape whose time is well above its floor is bound by the GEMM kernel at small M (its
   GFLOP/s says how close to the core's arithmetic it runs), not by memory bandwidth;
3. a roofline: the core's own arithmetic peak on one thread (a large square GEMM, fp32 and bf16),
   so each shape's time is read against max(its bytes at the copy bandwidth, its FLOPs at that
   peak), the rows at which an fp32 linear layer turns from bandwidth- to compute-bound (the
   ridge), and the step the measured kernels alone would take with no other op at all (packed
   linear layers at ``--batch`` rows plus the profiled attention): the best share of the
   ceiling these kernels allow, whatever the Python around them.

Writes bench/results/decode_profile.json (machine, load, both tables) and prints them.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from bench.machine import run_record, table, write_result
from bench.rollout_engine import copy_bandwidth
from envace.model.backends.hf import HFStepper
from envace.model.backends.packed_linear import MIN_ELEMENTS, available
from envace.model.models import load_model


def _us(f: Callable[[], Any], reps: int) -> float:
    f()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t) / reps * 1e6


def linear_shapes(model: Any) -> dict[tuple[int, int], int]:
    """(out, in) of every linear layer -> how many per decode step (the tied head included)."""
    shapes: dict[tuple[int, int], int] = {}
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            key = (m.out_features, m.in_features)
            shapes[key] = shapes.get(key, 0) + 1
    return shapes


def _copies(n: int, k: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Enough distinct weights of one shape (>= 64 MiB in all) that each call reads its weight
    from memory, not from the last call's cache, as a decode step does with its 30 layers."""
    count = max(1, -(-(64 << 20) // (n * k * 4)))
    return [torch.randn(n, k).to(dtype) for _ in range(count)]


def _per_call_us(fn: Callable[[torch.Tensor], Any], ws: list[Any], reps: int) -> float:
    rounds = max(1, reps // len(ws))
    return _us(lambda: [fn(w) for w in ws], rounds) / len(ws)


def gemm_rows(model: Any, rows: int, bandwidth: float, reps: int) -> list[dict[str, Any]]:
    """Every linear shape at `rows` and 2 rows: plain ``F.linear`` and the oneDNN-packed kernel
    (``envace.model.backends.packed_linear``), fp32 and bf16, weights cold in cache."""
    pack = torch.ops.mkldnn._reorder_linear_weight
    run = torch.ops.mkldnn._linear_pointwise
    out = []
    for (n, k), count in sorted(linear_shapes(model).items(), key=lambda x: -x[0][0] * x[0][1]):
        floor = n * k * 4 / (bandwidth * 1e9) * 1e6
        row: dict[str, Any] = {"shape": [n, k], "per_step": count, "fp32_floor_us": floor,
                               "packed": n * k >= MIN_ELEMENTS}
        for dt, tag in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            ws = _copies(n, k, dt)
            packed = [pack(w, rows) for w in ws] if available(dt) else []
            for m in (rows, 2):
                x = torch.randn(m, k).to(dt)
                r = out_row(out, row, m)
                r[f"{tag}_us"] = _per_call_us(lambda w, x=x: F.linear(x, w), ws, reps)
                r[f"{tag}_packed_us"] = _per_call_us(
                    lambda p, x=x: run(x, p, None, "none", [], ""), packed, reps) \
                    if packed else None
                r[f"{tag}_gflops"] = 2 * m * n * k / r[f"{tag}_us"] / 1e3
                r[f"{tag}_packed_gflops"] = 2 * m * n * k / r[f"{tag}_packed_us"] / 1e3 \
                    if packed else None
    return out


def peak_gflops(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    """The core's attainable arithmetic on one thread: best of `reps` n x n x n GEMMs (warm)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    best = min(_us(lambda: a @ b, 1) for _ in range(reps))
    return 2 * n ** 3 / best / 1e3


def roofline(gemms: list[dict[str, Any]], rows: int, bandwidth: float, peaks: dict[str, float],
             attention_ms: float, ceiling_ms: float) -> dict[str, Any]:
    """Per-step floors from the shapes at `rows` rows: the weights' bytes at `bandwidth`, their
    FLOPs at the fp32 `peaks`, and the kernels-only step (measured packed or plain linear times,
    as the engine picks, plus the profiled attention), each against the fp32 ceiling. Adds each
    shape's ``fp32_roofline_us`` and ``fp32_vs_roofline`` to its row of `gemms`."""
    at = [g for g in gemms if g["rows"] == rows]
    flops = sum(2 * rows * g["shape"][0] * g["shape"][1] * g["per_step"] for g in at)
    linear_ms = sum(g["per_step"] * (g["fp32_packed_us"] if g["packed"] and g["fp32_packed_us"]
                                     else g["fp32_us"]) for g in at) / 1e3
    for g in at:
        us = g["fp32_packed_us"] if g["packed"] and g["fp32_packed_us"] else g["fp32_us"]
        g["fp32_roofline_us"] = max(g["fp32_floor_us"],
                                    2 * rows * g["shape"][0] * g["shape"][1] / peaks["fp32"] / 1e3)
        g["fp32_vs_roofline"] = us / g["fp32_roofline_us"]
    kernels_ms = linear_ms + attention_ms
    return {"rows": rows, "peak_gflops": peaks,
            "ridge_rows_fp32": peaks["fp32"] * 4 / (2 * bandwidth),
            "ridge_rows_bf16": peaks["bf16"] * 2 / (2 * bandwidth),
            "linear_gflop_per_step": flops / 1e9,
            "linear_compute_floor_ms": flops / peaks["fp32"] / 1e6,
            "weights_bandwidth_floor_ms": ceiling_ms,
            "linear_kernels_ms": linear_ms, "attention_ms": attention_ms,
            "kernels_only_ms": kernels_ms, "kernels_only_share_of_ceiling": ceiling_ms / kernels_ms,
            "linear_share_of_peak": flops / linear_ms / 1e6 / peaks["fp32"]}


def out_row(out: list[dict[str, Any]], base: dict[str, Any], rows: int) -> dict[str, Any]:
    """The row of `out` for this shape at `rows` rows (created from `base` if new)."""
    for r in out:
        if r["shape"] == base["shape"] and r["rows"] == rows:
            return r
    out.append({**base, "rows": rows})
    return out[-1]


def profile_steps(model: Any, batch: int, prompt: int, steps: int, packed: bool = True
                  ) -> tuple[list[Any], float]:
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size - 1, (batch, prompt), generator=g).tolist()
    # rows of different lengths, as in a rollout: the attention mask is not all ones, so
    # attention takes the masked kernel a rollout takes
    st = HFStepper(model, 0, packed=packed)
    lg = st.prefill([r[: prompt - 7 * i] for i, r in enumerate(ids)])
    for _ in range(3):
        lg = st.step(lg.argmax(-1).tolist(), [True] * batch)
    t = time.perf_counter()
    for _ in range(steps):
        lg = st.step(lg.argmax(-1).tolist(), [True] * batch)
    plain = (time.perf_counter() - t) / steps
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(steps):
            lg = st.step(lg.argmax(-1).tolist(), [True] * batch)
    ops = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)
    return ([{"op": e.key, "calls_per_step": e.count / steps,
              "self_ms_per_step": e.self_cpu_time_total / steps / 1e3} for e in ops[:12]], plain)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=".cache/envace/bench-sft-smollm2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=600)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=200, help="calls per GEMM timing")
    ap.add_argument("--name", default="decode_profile")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    load_start = os.getloadavg()
    model, _ = load_model(args.model)
    model.eval()
    bw = copy_bandwidth(1)
    with torch.no_grad():
        steps = {k: profile_steps(model, args.batch, args.prompt, args.steps, packed=k == "packed")
                 for k in ("plain", "packed")}
        gemms = gemm_rows(model, args.batch, bw, args.reps)
        peaks = {"fp32": peak_gflops(torch.float32), "bf16": peak_gflops(torch.bfloat16)}
    ceiling_ms = sum(p.numel() * 4 for p in model.parameters()) / (bw * 1e9) * 1e3
    attention_ms = sum(o["self_ms_per_step"] for o in steps["packed"][0]
                       if "attention" in o["op"])
    roof = roofline(gemms, args.batch, bw, peaks, attention_ms, ceiling_ms)
    op_rows = []
    for kernel, (ops, ms) in steps.items():
        print(f"{args.model} ({kernel}): {ms * 1e3:.1f} ms per unprofiled decode step at "
              f"batch {args.batch}, {ceiling_ms / (ms * 1e3):.1%} of the fp32 bandwidth ceiling "
              f"({ceiling_ms:.1f} ms)")
        op_rows += [[kernel, o["op"][:48], f"{o['calls_per_step']:.0f}",
                     f"{o['self_ms_per_step']:.2f}"] for o in ops]
    print(table(op_rows, ["step", "op (profiled)", "calls/step", "self ms/step"]))

    def f(v: float | None, spec: str = ".0f") -> str:
        return "-" if v is None else format(v, spec)

    g_rows = [[f"{g['shape'][0]}x{g['shape'][1]}", g["per_step"], g["rows"],
               "yes" if g["packed"] else "no", f(g["fp32_floor_us"]), f(g["fp32_us"]),
               f(g["fp32_packed_us"]), f(g["fp32_us"] / g["fp32_floor_us"], ".2f"),
               f(g["fp32_packed_us"] and g["fp32_packed_us"] / g["fp32_floor_us"], ".2f"),
               f(g["fp32_gflops"], ".1f"), f(g["fp32_packed_gflops"], ".1f"), f(g["bf16_us"]),
               f(g["bf16_packed_us"])]
              for g in gemms]
    g_head = ["weight", "per step", "rows", "packed in decode", "fp32 floor us", "fp32 us",
              "fp32 packed us", "fp32/floor", "packed/floor", "fp32 GFLOP/s", "packed GFLOP/s",
              "bf16 us", "bf16 packed us"]
    print(table(g_rows, g_head))
    print(f"roofline, one thread: fp32 peak {peaks['fp32']:.0f} GFLOP/s, bf16 {peaks['bf16']:.0f}; "
          f"an fp32 linear layer turns compute-bound above {roof['ridge_rows_fp32']:.1f} rows "
          f"(bf16 {roof['ridge_rows_bf16']:.1f}). At {args.batch} rows the linear layers' "
          f"{roof['linear_gflop_per_step']:.2f} GFLOP per step take "
          f"{roof['linear_compute_floor_ms']:.1f} ms at peak against the weights' "
          f"{ceiling_ms:.1f} ms at the copy bandwidth; the kernels run them at "
          f"{roof['linear_share_of_peak']:.0%} of peak ({roof['linear_kernels_ms']:.1f} ms). "
          f"Those kernels plus attention ({attention_ms:.1f} ms) and nothing else: "
          f"{roof['kernels_only_ms']:.1f} ms, {roof['kernels_only_share_of_ceiling']:.1%} of the "
          "ceiling at most")
    path = write_result(args.name, {
        **run_record("bench.decode_profile", argv, load_start),
        "model": args.model, "batch": args.batch, "prompt": args.prompt, "threads": 1,
        "copy_bandwidth_gb_s": bw, "fp32_ceiling_ms_per_step": ceiling_ms,
        "unprofiled_ms_per_step": {k: v[1] * 1e3 for k, v in steps.items()},
        "roofline": roof,
        "top_ops": {k: v[0] for k, v in steps.items()}, "gemms": gemms,
        "tables": {"ops": op_rows, "gemms": {"header": g_head, "rows": g_rows}}})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
