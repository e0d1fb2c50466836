"""Benchmark: does a static KV cache with a compiled decode step beat our eager decode on CPU?

    .venv/bin/python -m bench.decode_compile                       # tiny + smollm2, batch 8
    .venv/bin/python -m bench.decode_compile --only tiny --batch 2 --steps 20   # smoke

Issue #18 names two levers for the per-token cost of decoding: a static KV cache and a compiled
decode step (``torch.compile``, whose inductor backend generates C++ on CPU). This measures them
against what the rollout engine runs, on one thread, same model, same prompts, greedy:

- ``ours``: ``HFStepper`` (the block-grown cache of ``envace.model.backends.kv_cache``, eager);
- ``static``: transformers' ``StaticCache`` (every step the same shapes: the attention reads the
  whole preallocated cache under a mask), eager;
- ``static+compile``: the same step through ``torch.compile(dynamic=False)``: one graph for every
  step, compiled once (its seconds reported apart).

Each side prefills ``--batch`` random prompts of ``--prompt`` tokens, then decodes ``--steps``
one-token steps (the argmax of the last logits fed back); a side's figure is the best of
``--repeats`` runs of CPU seconds (``time.process_time``: what this process spent, less moved by
other processes than wall time) and wall seconds per step. The largest logit difference from
``ours`` is recorded beside each (the compiled step must compute the same function). Writes
bench/results/decode_compile.json with the machine and its load, and prints the ratios
ours / other in steps per second (above 1: the other is faster).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.machine import run_record, table, write_result
from envace.model.backends.hf import CACHE_KW, HFStepper
from envace.model.models import default_cache_dir, load_model, resolve_model

Run = Callable[[], tuple[float, float, torch.Tensor]]


def _timed(body: Callable[[], list[torch.Tensor]], steps: int) -> tuple[float, float, torch.Tensor]:
    c0, w0 = time.process_time(), time.perf_counter()
    outs = body()
    return ((time.process_time() - c0) / steps, (time.perf_counter() - w0) / steps,
            torch.stack(outs))


def ours(model: Any, ids: torch.Tensor, steps: int) -> Run:
    def run() -> tuple[float, float, torch.Tensor]:
        st = HFStepper(model, 0)
        first = st.prefill(ids.tolist())

        def body() -> list[torch.Tensor]:
            lg, outs = first, [first]
            for _ in range(steps):
                lg = st.step(lg.argmax(-1).tolist(), [True] * ids.shape[0])
                outs.append(lg)
            return outs

        return _timed(body, steps)

    return run


def static(model: Any, ids: torch.Tensor, steps: int, compiled: bool) -> tuple[Run, float]:
    """The static-cache side and its compile seconds (0 when eager)."""
    from transformers.cache_utils import StaticCache

    b, n = ids.shape
    cap = n + steps + 8

    def step(tok: torch.Tensor, pos: torch.Tensor, cache: Any, mask: torch.Tensor) -> torch.Tensor:
        return model(input_ids=tok, position_ids=pos, cache_position=pos[0], attention_mask=mask,
                     **{CACHE_KW: cache}, use_cache=True, logits_to_keep=1).logits[:, -1].float()

    fn = torch.compile(step, dynamic=False) if compiled else step

    @torch.no_grad()
    def run() -> tuple[float, float, torch.Tensor]:
        cache = StaticCache(config=model.config, max_cache_len=cap)
        mask = torch.zeros(b, cap, dtype=torch.long)
        mask[:, :n] = 1
        out = model(input_ids=ids, position_ids=torch.arange(n)[None].expand(b, -1),
                    cache_position=torch.arange(n), attention_mask=mask, **{CACHE_KW: cache},
                    use_cache=True, logits_to_keep=1)
        first = out.logits[:, -1].float()

        def body() -> list[torch.Tensor]:
            lg, outs = first, [first]
            for i in range(steps):
                mask[:, n + i] = 1
                lg = fn(lg.argmax(-1)[:, None], torch.full((b, 1), n + i), cache, mask)
                outs.append(lg)
            return outs

        return _timed(body, steps)

    t = time.perf_counter()
    if compiled:
        run()  # compiles (and runs once)
    return run, time.perf_counter() - t


def measure(path: str, batch: int, prompt: int, steps: int, repeats: int) -> dict[str, Any]:
    model, _ = load_model(path)
    model.eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, min(4000, model.config.vocab_size), (batch, prompt), generator=g)
    sides: dict[str, Run] = {"ours": ours(model, ids, steps)}
    sides["static"], _ = static(model, ids, steps, compiled=False)
    sides["static+compile"], compile_s = static(model, ids, steps, compiled=True)
    best: dict[str, dict[str, float]] = {}
    ref = None
    for _ in range(repeats):  # alternating, so load changes touch every side alike
        for name, run in sides.items():
            cpu, wall, logits = run()
            if ref is None:
                ref = logits
            cur = best.setdefault(name, {"cpu_s_per_step": cpu, "wall_s_per_step": wall,
                                         "max_logit_diff": 0.0})
            cur["cpu_s_per_step"] = min(cur["cpu_s_per_step"], cpu)
            cur["wall_s_per_step"] = min(cur["wall_s_per_step"], wall)
            cur["max_logit_diff"] = max(cur["max_logit_diff"],
                                        float((logits - ref).abs().max()))
    ratios = {name: {"cpu": best["ours"]["cpu_s_per_step"] / b["cpu_s_per_step"],
                     "wall": best["ours"]["wall_s_per_step"] / b["wall_s_per_step"]}
              for name, b in best.items() if name != "ours"}
    return {"model": path, "batch": batch, "prompt": prompt, "steps": steps,
            "repeats": repeats, "compile_seconds": compile_s, "sides": best,
            "other_over_ours_steps_per_s": ratios}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="+", choices=["tiny", "smollm2"], default=["tiny", "smollm2"])
    ap.add_argument("--tiny", default="data/models/tiny-sft")
    ap.add_argument("--smollm2", help="smollm2 model folder (default: the converted preset)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=600, help="prompt tokens per row")
    ap.add_argument("--steps", type=int, default=40, help="one-token decode steps per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default="decode_compile")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    load_start = os.getloadavg()
    results: dict[str, Any] = {}
    rows = []
    for which in args.only:
        path = args.tiny if which == "tiny" else (
            args.smollm2 or str(resolve_model("smollm2", default_cache_dir())))
        r = measure(path, args.batch, args.prompt, args.steps, args.repeats)
        results[which] = r
        for name, s in r["sides"].items():
            ratio = r["other_over_ours_steps_per_s"].get(name, {"cpu": 1.0, "wall": 1.0})
            rows.append([which, name, f"{s['cpu_s_per_step'] * 1e3:.2f}",
                         f"{s['wall_s_per_step'] * 1e3:.2f}", f"{ratio['cpu']:.2f}x",
                         f"{ratio['wall']:.2f}x", f"{s['max_logit_diff']:.1e}"])
        print(f"{which}: compiled in {r['compile_seconds']:.0f} s", flush=True)
    header = ["model", "side", "cpu ms/step", "wall ms/step", "steps/s vs ours (cpu)",
              "(wall)", "max |logit - ours|"]
    print(table(rows, header))
    path = write_result(args.name, {
        **run_record("bench.decode_compile", argv, load_start), "threads": 1,
        "results": results, "table": {"header": header, "rows": rows}})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
