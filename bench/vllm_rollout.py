"""Benchmark: rollout throughput of the vLLM backend against the transformers backend.

    bash scripts/setup_vllm.sh && .venv-vllm/bin/python -m bench.vllm_rollout   # ~8 min on 2 CPUs
    .venv-vllm/bin/python -m bench.vllm_rollout --only tiny --out vllm_rollout_smoke   # smoke

Same model, same episodes (dev tasks with 6 or more ground-truth calls, mode ``rehearse``: the
policy acts and writes every tool response), three sides, each in its own process (vLLM's CPU
engine binds OpenMP threads and stubs ``torch.set_num_threads``, which would bias a side that
runs after it):

- ``hf``: ``envace.model.rollout.run_episodes``, lockstep batched decoding over one kept KV cache;
- ``vllm``: ``envace.model.backends.base.run_episodes_backend`` on ``VLLMBackend`` (in-process
  ``vllm.LLM``, prefix caching on): each message is a request whose prompt is the whole episode
  so far;
- ``vllm_noprefix``: the same with prefix caching off (what the cache saves).

Two workloads per model: ``greedy`` (distinct tasks, temperature 0: the sides must write the
same tokens, checked as ``identical_episodes``) and ``group`` (the training shape: each task
``group`` times, temperature 1, as GRPO samples it; token counts then differ between sides, so
the figure is generated tokens per second). Engine start-up is reported apart and not timed in
the throughput; a small warm-up rollout precedes each timed one. Models: the tiny cold start
(``<cache>/bench-sft-tiny`` when present, else the vLLM lane's 40-step one) and SmolLM2-135M
(zero-shot preset). Neither writes well-formed tool calls yet: tiny episodes mostly end at
their first message (a malformed call), so its figures weigh prompt prefill and batched decoding;
SmolLM2 answers each user turn in prose, so with room to finish (``greedy``: 128 tokens) the next
user turn is forced in and an episode takes several requests (``requests_per_episode``), where
the prefix cache earns its keep. Writes bench/results/<out>.json (default vllm_rollout) with
ratios vLLM / transformers (``ratio_vllm_over_hf``) and prefix cache on / off.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see vllm_backend

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

PLAN = {  # per model and workload: episodes and limits (sized for 2 CPU cores)
    "tiny": {"greedy": {"tasks": 16, "max_new_tokens": 96, "max_turns": 6},
             "group": {"tasks": 8, "group": 4, "max_new_tokens": 96, "max_turns": 6}},
    # SmolLM2 answers each user turn in prose: with room to finish, the next user turn is
    # forced in and the episode goes on (several requests per episode)
    "smollm2": {"greedy": {"tasks": 4, "max_new_tokens": 128, "max_turns": 4},
                "group": {"tasks": 2, "group": 4, "max_new_tokens": 64, "max_turns": 2}},
}
SIDES = ("hf", "vllm", "vllm_noprefix")


def model_path(name: str) -> tuple[Path, str]:
    from envace.model.models import default_cache_dir, read_marker, resolve_model

    if name == "tiny":
        sft = default_cache_dir() / "bench-sft-tiny"
        if read_marker(sft):
            return sft, f"cold start cached at {sft} (envace sft --preset tiny)"
        from envace.training.sft import SFTSettings, run_sft

        path = run_sft(SFTSettings(preset="tiny", max_steps=40, max_minutes=4.0, seed=0),
                       quiet=True)
        return Path(path), "40-step cold start of the tiny preset (the vLLM lane's)"
    return resolve_model(name, default_cache_dir()), "zero-shot preset"


def _tasks(plan: dict[str, Any], min_calls: int) -> dict[str, list]:
    from envace.core.envs.bfcl.tasks import split_tasks

    long = [t for t in split_tasks("dev") if sum(len(g) for g in t.ground_truth) >= min_calls]
    return {"greedy": long[:plan["greedy"]["tasks"]],
            "group": [t for t in long[:plan["group"]["tasks"]]
                      for _ in range(plan["group"]["group"])]}


def _summary(episodes: list, seconds: float) -> dict[str, Any]:
    from envace.model.rollout import ACT, REHEARSE

    gen = sum(e.tokens(ACT) + e.tokens(REHEARSE) for e in episodes)
    return {"seconds": seconds, "generated_tokens": gen, "tokens_per_s": gen / seconds,
            "rehearse_tokens": sum(e.tokens(REHEARSE) for e in episodes),
            "context_tokens": sum(len(e.ids) for e in episodes) - gen,
            "requests_per_episode": sum(  # generated messages (assistant + rehearsed)
                len([m for m in e.trajectory.messages if m.role in ("assistant", "tool")])
                for e in episodes) / len(episodes),
            "end_reasons": _count(e.end_reason.split(":")[0] for e in episodes)}


def side_ratios(sides: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """The figures: vLLM's tokens/s over transformers' (``hf``), and vLLM's with prefix caching
    over without, for greedy episodes and sampled groups."""
    rate = lambda side, w: sides[side][w]["tokens_per_s"]  # noqa: E731
    return {"ratio_vllm_over_hf": {w: rate("vllm", w) / rate("hf", w) for w in ("greedy", "group")},
            "ratio_prefix_cache": {w: rate("vllm", w) / rate("vllm_noprefix", w)
                                   for w in ("greedy", "group")}}


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def run_side(side: str, path: str, plan: dict[str, Any], min_calls: int) -> dict[str, Any]:
    """One side in this process: start-up, then a warm-up and a timed rollout per workload."""
    import torch

    from envace.model.backends.base import run_episodes_backend
    from envace.model.models import load_model
    from envace.model.rollout import RolloutConfig, run_episodes

    t0 = time.perf_counter()
    model, tok = load_model(path)
    model.eval()
    if torch.cuda.is_available():
        model.cuda()
    if side == "hf":
        def roll(tasks: list, cfg: RolloutConfig) -> list:
            return run_episodes(model, tok, tasks, cfg)
    else:
        from envace.model.backends.vllm_backend import VLLMBackend

        be = VLLMBackend(path, dtype="float32", seed=0, max_model_len=4096,
                         enable_prefix_caching=side == "vllm")

        def roll(tasks: list, cfg: RolloutConfig) -> list:
            return run_episodes_backend(be, tok, tasks, cfg)
    out: dict[str, Any] = {"startup_s": time.perf_counter() - t0,
                           "torch_threads": torch.get_num_threads()}
    for name, tasks in _tasks(plan, min_calls).items():
        cfg = RolloutConfig(mode="rehearse", temperature=0.0 if name == "greedy" else 1.0,
                            max_new_tokens=plan[name]["max_new_tokens"],
                            max_turns=plan[name]["max_turns"], max_context=4096, seed=0)
        roll(tasks[:1], RolloutConfig(**{**vars(cfg), "max_turns": 1, "max_new_tokens": 2}))
        t = time.perf_counter()
        eps = roll(tasks, cfg)
        out[name] = {**_summary(eps, time.perf_counter() - t), "episodes": len(eps),
                     "ids": [e.ids for e in eps] if name == "greedy" else None}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="+", choices=sorted(PLAN), default=["tiny", "smollm2"])
    ap.add_argument("--min-calls", type=int, default=6, help="ground-truth calls per task")
    ap.add_argument("--out", default="vllm_rollout", help="result name under bench/results/")
    ap.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # a child process
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side:
        res = run_side(args.side, args.path, PLAN[args.model], args.min_calls)
        print("RESULT " + json.dumps(res), flush=True)
        return 0

    from bench.machine import table, write_result

    args_given = sys.argv[1:] if argv is None else argv
    command = " ".join(["python", "-m", "bench.vllm_rollout", *args_given])

    load = os.getloadavg()[0]
    print(f"1-minute load average {load:.2f}: {'quiet' if load < 1.5 else 'BUSY (noisy)'}")
    results: dict[str, Any] = {}
    for name in args.only:
        path, note = model_path(name)
        print(f"[{name}] {path} ({note}): {PLAN[name]}", flush=True)
        sides: dict[str, Any] = {}
        for side in SIDES:
            cmd = [sys.executable, "-m", "bench.vllm_rollout", "--side", side, "--path",
                   str(path), "--model", name, "--min-calls", str(args.min_calls)]
            env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}
            r = subprocess.run(cmd, capture_output=True, text=True, env=env)
            line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
            if r.returncode != 0 or not line:
                raise RuntimeError(f"{side} failed:\n{r.stderr[-3000:]}")
            sides[side] = json.loads(line[0][7:])
            print(f"  {side}: " + ", ".join(
                f"{w} {sides[side][w]['tokens_per_s']:.1f} tok/s" for w in ("greedy", "group")),
                flush=True)
        same = sum(a == b for a, b in zip(sides["hf"]["greedy"]["ids"],
                                          sides["vllm"]["greedy"]["ids"], strict=True))
        for s in sides.values():
            s["greedy"].pop("ids")
            s["group"].pop("ids")
        results[name] = {
            "note": note, "path": str(path), "plan": PLAN[name], "sides": sides,
            "identical_greedy_episodes": same,
            **side_ratios(sides),
        }
    rows = [[n, w, r["sides"]["hf"][w]["episodes"], r["sides"]["vllm"][w]["requests_per_episode"],
             r["sides"]["hf"][w]["generated_tokens"],
             r["sides"]["vllm"][w]["generated_tokens"], r["sides"]["hf"][w]["tokens_per_s"],
             r["sides"]["vllm"][w]["tokens_per_s"],
             r["sides"]["vllm_noprefix"][w]["tokens_per_s"], r["ratio_vllm_over_hf"][w],
             r["ratio_prefix_cache"][w]]
            for n, r in results.items() for w in ("greedy", "group")]
    print(table(rows, ["model", "workload", "eps", "msgs/ep", "gen hf", "gen vllm", "hf tok/s",
                       "vllm tok/s", "vllm no-prefix tok/s", "vllm/hf", "prefix gain"]))
    import torch

    out = write_result(args.out, {
        "command": command, "device": "cuda" if torch.cuda.is_available() else "cpu",
        "quiet_machine": load < 1.5, "load_avg_1min": load,
        "load_avg_1min_end": os.getloadavg()[0], "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
        "min_ground_truth_calls": args.min_calls, "models": results})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
