"""Benchmark: what bounds one decode step (issue #18 item 2): a profile and the GEMMs alone.

    .venv/bin/python -m bench.decode_profile              # SmolLM2 + SFT, batch 8
    .venv/bin/python -m bench.decode_profile --model data/models/tiny-sft --batch 8

Two measurements on one thread, same model the rollout engine decodes with:

1. ``torch.profiler`` over ``--steps`` one-token steps of ``HFStepper`` (``--batch`` random prompts
   of ``--prompt`` tokens, the block-grown KV cache): the top ops by self CPU time per step;
2. every linear layer shape of the model at M = ``--batch`` rows (and at M = 2 for contrast),
   fp32 and bf16 ``F.linear``, against its floor: the weight bytes at this machine's copy
   bandwidth (``bench.rollout_engine.copy_bandwidth``). A shape whose fp32 time is well above its
   floor is not bound by memory bandwidth but by the GEMM kernel at small M; bf16 reads half the
   bytes.

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


def gemm_rows(model: Any, rows: int, bandwidth: float, reps: int) -> list[dict[str, Any]]:
    out = []
    for (n, k), count in sorted(linear_shapes(model).items(), key=lambda x: -x[0][0] * x[0][1]):
        w = torch.randn(n, k)
        floor = n * k * 4 / (bandwidth * 1e9) * 1e6
        for m in (rows, 2):
            x = torch.randn(m, k)
            fp32 = _us(lambda x=x, w=w: F.linear(x, w), reps)
            bf16 = _us(lambda x=x.bfloat16(), w=w.bfloat16(): F.linear(x, w), reps)
            out.append({"shape": [n, k], "per_step": count, "rows": m, "fp32_us": fp32,
                        "bf16_us": bf16, "fp32_floor_us": floor})
    return out


def profile_steps(model: Any, batch: int, prompt: int, steps: int) -> tuple[list[Any], float]:
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size - 1, (batch, prompt), generator=g)
    st = HFStepper(model, 0)
    lg = st.prefill(ids.tolist())
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
        ops, plain = profile_steps(model, args.batch, args.prompt, args.steps)
        gemms = gemm_rows(model, args.batch, bw, args.reps)
    op_rows = [[o["op"][:48], f"{o['calls_per_step']:.0f}", f"{o['self_ms_per_step']:.2f}"]
               for o in ops]
    print(f"{args.model}: {plain * 1e3:.1f} ms per unprofiled decode step at batch {args.batch}")
    print(table(op_rows, ["op (profiled)", "calls/step", "self ms/step"]))
    g_rows = [[f"{g['shape'][0]}x{g['shape'][1]}", g["per_step"], g["rows"],
               f"{g['fp32_us']:.0f}", f"{g['fp32_floor_us']:.0f}",
               f"{g['fp32_us'] / g['fp32_floor_us']:.2f}", f"{g['bf16_us']:.0f}",
               f"{g['fp32_us'] / g['bf16_us']:.2f}x"] for g in gemms]
    g_head = ["weight", "per step", "rows", "fp32 us", "fp32 floor us", "fp32/floor",
              "bf16 us", "bf16 speedup"]
    print(table(g_rows, g_head))
    path = write_result(args.name, {
        **run_record("bench.decode_profile", argv, load_start),
        "model": args.model, "batch": args.batch, "prompt": args.prompt, "threads": 1,
        "copy_bandwidth_gb_s": bw, "unprofiled_ms_per_step": plain * 1e3,
        "top_ops": ops, "gemms": gemms,
        "tables": {"ops": op_rows, "gemms": {"header": g_head, "rows": g_rows}}})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
