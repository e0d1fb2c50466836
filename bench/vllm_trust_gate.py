"""Benchmark: the confidence gate on vLLM rollouts, measured (issue 42 §2).

    bash scripts/setup_vllm.sh && .venv-vllm/bin/python -m bench.vllm_trust_gate [--tasks 20]

The tiny cold start (``data/models/tiny-sft``) on BFCL dev tasks (per-turn, a seeded sample that
fits the context), greedy, as training's rollouts run them on the vLLM backend
(``run_episodes_backend`` on ``VLLMBackend``): mode ``real`` (the environment answers every
call), mode ``rehearse`` (the policy writes every tool response) and ``rehearse`` gated at
``rehearse_trust=C`` for the thresholds of the transformers evaluation in docs/results.md
(-0.517, -0.214, -0.008: the lower quartile, the median and the 5 %-risk threshold of the cold
start's own confidences). Per setting: mean reward (``--reward``, BFCL's verifier of the
episode's calls) and success, the paired difference to plain rehearsal over the tasks with a
bootstrap interval (tasks resampled, 2,000 draws, seed 0), calls answered by reality (the
environment's in ``real``, the gate's in a gated setting), rehearsals kept, seconds. The same
episodes through the transformers engine (``run_episodes``) must give the same rewards and gate
counts (``same_as_transformers``; greedy, two fp32 implementations). Both engines in one process
(vLLM binds OpenMP threads), so the seconds are vLLM's only. Writes bench/results/<--name>.json.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see vllm_backend

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from bench.machine import run_record, table, write_result  # noqa: E402

THRESHOLDS = (-0.517, -0.214, -0.008)
ROOT = Path(__file__).resolve().parents[1]


def paired(diff: list[float], draws: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Mean of per-task differences and its bootstrap interval (tasks resampled)."""
    d = np.asarray(diff, dtype=float)
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(draws, len(d)))].mean(axis=1)
    return {"mean": float(d.mean()), "ci": [float(np.quantile(means, 0.025)),
                                             float(np.quantile(means, 0.975))]}


def outcome(episodes: list[Any], reward: str) -> list[dict[str, Any]]:
    """Per episode: reward, success, calls answered by reality and rehearsals kept."""
    from envace.core.rewards import task_reward
    from envace.model.trust import gate_counts

    out = []
    for e in episodes:
        v = task_reward(reward, e.task, e.calls_per_turn, e.final_text)
        counts = gate_counts(e.trajectory.messages)
        tools = [m for m in e.trajectory.messages if m.role == "tool"]
        real = sum(1 for m in tools if m.rehearsed is not True)
        out.append({"task": e.task.id, "reward": float(v["reward"]), "success": bool(v["success"]),
                    "real_calls": real, "gated_real": counts["gated_real"],
                    "rehearsed_kept": counts["rehearsed"]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--reward", default="action_partial")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="vllm_trust_gate_tiny")
    args = ap.parse_args(argv)
    load = os.getloadavg()

    from envace.evaluation.evaluate import select_tasks
    from envace.model.backends.base import run_episodes_backend
    from envace.model.backends.vllm_backend import VLLMBackend
    from envace.model.models import load_model
    from envace.model.rollout import RolloutConfig, run_episodes

    path = ROOT / "data" / "models" / "tiny-sft"
    model, tok = load_model(path)
    model.eval()
    tasks = select_tasks("dev", "turn", args.tasks, tok, 2048, args.max_new_tokens, args.seed)
    t0 = time.perf_counter()
    be = VLLMBackend(path, dtype="float32", seed=args.seed, max_model_len=2048)
    startup = time.perf_counter() - t0
    settings: list[tuple[str, str, float | None]] = [("real", "real", None),
                                                     ("rehearse", "rehearse", None)]
    settings += [(f"trust>={c}", "rehearse", c) for c in THRESHOLDS]
    res: dict[str, Any] = {"tasks": [t.id for t in tasks], "engine_startup_s": startup,
                           "settings": {}}
    rows = []
    try:
        for name, mode, trust in settings:
            cfg = RolloutConfig(mode=mode, temperature=0.0, max_turns=args.max_turns,
                                max_new_tokens=args.max_new_tokens, rehearse_trust=trust,
                                seed=args.seed)
            a = time.perf_counter()
            got = outcome(run_episodes_backend(be, tok, tasks, cfg), args.reward)
            secs = time.perf_counter() - a
            ref = outcome(run_episodes(model, tok, tasks, cfg), args.reward)
            res["settings"][name] = {"mode": mode, "rehearse_trust": trust, "seconds": secs,
                                     "episodes": got,
                                     "same_as_transformers": got == ref}
    finally:
        be.close()
    base = [e["reward"] for e in res["settings"]["rehearse"]["episodes"]]
    for name, block in res["settings"].items():
        eps = block["episodes"]
        block.update(
            mean_reward=float(np.mean([e["reward"] for e in eps])),
            success=float(np.mean([e["success"] for e in eps])),
            real_calls=sum(e["real_calls"] for e in eps),
            gated_real=sum(e["gated_real"] for e in eps),
            rehearsed_kept=sum(e["rehearsed_kept"] for e in eps),
            vs_rehearse=paired([e["reward"] - b for e, b in zip(eps, base, strict=True)]))
        v = block["vs_rehearse"]
        rows.append([name, block["mean_reward"], block["success"],
                     f"{v['mean']:+.3f} [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]",
                     block["real_calls"], block["gated_real"], block["rehearsed_kept"],
                     block["seconds"], block["same_as_transformers"]])
    print(table(rows, ["setting", "reward", "success", "vs rehearse", "real calls",
                       "sent by the gate", "rehearsals kept", "vLLM s", "= transformers"]))
    print("->", write_result(args.name, {**res, **run_record("bench.vllm_trust_gate", argv, load),
                                        "reward": args.reward, "seed": args.seed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
