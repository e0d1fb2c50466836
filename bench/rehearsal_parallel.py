"""Benchmark: N rehearsed plans batched together against N independent one-plan runs.

    .venv/bin/python -m bench.rehearsal_parallel [--model PATH] [--tasks 4]

Parallel rehearsal runs the N plans of a task as N rows of one lockstep batch over one KV cache
(the prompt is encoded in one batched prefill); the reference runs each plan on its own. Same
model, tasks, sampling and token budget; wall time for N = 1..4 and the ratio
batched / (N x one plan). Writes bench/results/rehearsal_parallel.json.
"""

from __future__ import annotations

import argparse
import time

from bench.machine import table, write_result
from envace.eval_cli import select_tasks
from envace.models import load_model
from envace.rollout import RolloutConfig, run_episodes

DEFAULT_MODEL = "data/models/tiny-sft"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()
    model, tok = load_model(args.model)
    tasks = select_tasks("dev", "turn", args.tasks, tok, 4096, args.max_new_tokens, 0)
    cfg = RolloutConfig(mode="rehearse", temperature=0.8, max_new_tokens=args.max_new_tokens,
                        max_turns=4, max_context=4096, seed=0)
    run_episodes(model, tok, tasks[:1], cfg)  # warm up
    rows, res = [], {"model": args.model, "tasks": len(tasks), "runs": {}}
    for n in range(1, 5):
        t = time.perf_counter()
        batched = run_episodes(model, tok, [x for x in tasks for _ in range(n)], cfg)
        t_batched = time.perf_counter() - t
        t = time.perf_counter()
        single = []
        for x in tasks:
            for _ in range(n):
                single += run_episodes(model, tok, [x], cfg)
        t_single = time.perf_counter() - t
        toks = [sum(len(e.ids) - e.prompt_len for e in eps) for eps in (batched, single)]
        res["runs"][str(n)] = {"batched_s": t_batched, "independent_s": t_single,
                               "ratio": t_batched / t_single, "tokens_batched": toks[0],
                               "tokens_independent": toks[1]}
        rows.append([n, t_batched, t_single, t_batched / t_single, toks[0], toks[1]])
    print(table(rows, ["N plans", "batched s", "N independent s", "ratio", "tokens (batched)",
                       "tokens (indep.)"]))
    print("->", write_result("rehearsal_parallel", res))


if __name__ == "__main__":
    main()
