"""Benchmark: N rehearsed plans batched together against N independent one-plan runs.

    .venv/bin/python -m bench.rehearsal_parallel [--model PATH] [--tasks 4]

Parallel rehearsal runs the N plans of a task as N rows of one lockstep batch over one KV cache:
the shared prompt (system, tool listing, request) is encoded once and its cache copied to the N
rows, and a plan that ends leaves the batch. The reference runs each plan on its own (N prefills
of the same prompt). Per task, same model, sampling and token budget; wall time for N = 1..4,
the ratio batched / (N independent), and the same ratio per generated token.

Equal work by default (``--temperature 0``): greedy plans of one prompt are identical, so both
sides generate exactly the same tokens and the ratio measures batching alone (checked: the
token counts are recorded and must agree). With ``--temperature 0.8`` the plans are sampled, as
test-time rehearsal samples them; sampled plans differ in length between the two sides, so only
the per-token ratio compares like with like. Decoding runs on one thread (the rollout engine's
``decode_threads``). Writes bench/results/<--name>.json with the machine and its load.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

from bench.machine import run_record, table, write_result
from envace.evaluation.evaluate import select_tasks
from envace.model.models import load_model
from envace.model.rollout import RolloutConfig, run_episodes

DEFAULT_MODEL = "data/models/tiny-sft"


def batching(t_batched: float, t_single: float, tokens_batched: int,
             tokens_single: int) -> dict[str, float]:
    """N plans in one batch against N one-plan runs: the wall-time ratio (the figure) and the
    same per generated token (a side that generated nothing counts as one token)."""
    per_tok = (t_batched / max(1, tokens_batched)) / (t_single / max(1, tokens_single))
    return {"batched_s": t_batched, "independent_s": t_single, "ratio": t_batched / t_single,
            "ratio_per_token": per_tok, "tokens_batched": tokens_batched,
            "tokens_independent": tokens_single}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0: greedy, equal work on both sides (default); > 0: sampled plans")
    ap.add_argument("--name", default="rehearsal_parallel")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    model, tok = load_model(args.model)
    tasks = select_tasks("dev", "turn", args.tasks, tok, 4096, args.max_new_tokens, 0)
    cfg = RolloutConfig(mode="rehearse", temperature=args.temperature,
                        max_new_tokens=args.max_new_tokens, max_turns=4, max_context=4096,
                        seed=0)
    run_episodes(model, tok, tasks[:1], cfg)  # warm up
    rows, res = [], {"model": args.model, "tasks": len(tasks), "temperature": args.temperature,
                     "max_new_tokens": args.max_new_tokens, "decode_threads": 1,
                     "equal_work": args.temperature == 0, "runs": {}}
    for n in range(1, 5):
        t_batched = t_single = 0.0
        batched, single = [], []
        for k, x in enumerate(tasks):
            t = time.perf_counter()
            batched += run_episodes(model, tok, [x] * n, cfg)
            t_batched += time.perf_counter() - t
            t = time.perf_counter()
            for j in range(n):
                c = dataclasses.replace(cfg, seed=1000 * k + j)
                single += run_episodes(model, tok, [x], c)
            t_single += time.perf_counter() - t
        toks = [sum(len(e.ids) - e.prompt_len for e in eps) for eps in (batched, single)]
        r = res["runs"][str(n)] = batching(t_batched, t_single, toks[0], toks[1])
        rows.append([n, t_batched, t_single, r["ratio"], r["ratio_per_token"], toks[0], toks[1]])
    print(table(rows, ["N plans", "batched s", "N independent s", "ratio", "ratio per token",
                       "tokens (batched)", "tokens (indep.)"]))
    res.update(run_record("bench.rehearsal_parallel", argv, load_start))
    print("->", write_result(args.name, res))


if __name__ == "__main__":
    main()
