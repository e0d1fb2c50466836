"""Does gating rehearsal on confidence help training? The gated `envace` runs beside plain
`envace` and `grpo` of the same seeds, step by step (issue 42, section 2).

    .venv/bin/python -m experiments.trust_gate_training --steps 10 \
        --gated RUN_s0 RUN_s1 RUN_s2 --envace RUN_s0 RUN_s1 RUN_s2 --grpo RUN_s0 RUN_s1 RUN_s2

Each argument is a training run directory (its ``metrics.jsonl``), one per seed, in the same
seed order for the three settings: the tiny preset's equal-steps recipe with
``rehearse_trust=C`` (gated), without it (plain rehearsal) and ``mode=grpo`` (plain real), as
``experiments.fidelity_nll_curve`` runs them. Every run of a seed samples the same tasks at
each step, so the steps pair. Per seed: the mean training reward (``reward/mean``) over the
first ``--steps`` steps, each setting minus plain rehearsal with a paired t interval over the
steps, the calls the gate sent to reality (``calls/gated_real``) and kept rehearsed
(``calls/rehearsed``), and the held-out bits per byte after ``--steps`` updates where logged.
Over seeds: the mean of the per-seed differences and its t interval (the seed is the unit).
Writes bench/results/<--name>.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

from bench.machine import run_record, write_result
from envace.core.layout import RUN


def rows_of(run: str) -> list[dict[str, Any]]:
    """A run's metrics rows, in step order."""
    text = (Path(run) / RUN.metrics).read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["step"])


def t_interval(values: list[float]) -> list[float] | None:
    """The 95 % t interval of the mean of ``values`` (None below two)."""
    if len(values) < 2:
        return None
    from scipy import stats

    mean = sum(values) / len(values)
    sd = stats.tstd(values)
    half = stats.t.ppf(0.975, len(values) - 1) * sd / math.sqrt(len(values))
    return [mean - half, mean + half]


def bpb_after(rows: list[dict[str, Any]], steps: int) -> float | None:
    """Held-out bits per byte after ``steps`` updates (logged before step ``steps``'s update,
    or at the end of a run of exactly that many steps)."""
    for r in rows:
        if r["step"] == steps and r.get("fidelity_bpb") is not None:
            return float(r["fidelity_bpb"])
    last = [r for r in rows if r["step"] == steps - 1 and r.get("fidelity_bpb_end") is not None]
    return float(last[0]["fidelity_bpb_end"]) if last else None


def seed_block(gated: str, envace: str, grpo: str, steps: int) -> dict[str, Any]:
    """One seed's figures (see the module docstring)."""
    runs = {"gated": rows_of(gated), "envace": rows_of(envace), "grpo": rows_of(grpo)}
    for name, rows in runs.items():
        if len(rows) < steps:
            raise SystemExit(f"{name} run has {len(rows)} steps, fewer than --steps {steps}")
    reward = {k: [float(r["reward/mean"]) for r in rows[:steps]] for k, rows in runs.items()}
    out: dict[str, Any] = {"runs": {"gated": gated, "envace": envace, "grpo": grpo}}
    for k in runs:
        out[k] = {"mean_reward": sum(reward[k]) / steps,
                  "bits_per_byte_after": bpb_after(runs[k], steps)}
    for k in ("gated", "grpo"):
        diff = [a - b for a, b in zip(reward[k], reward["envace"], strict=True)]
        out[k]["minus_envace"] = {"mean": sum(diff) / steps, "ci": t_interval(diff)}
    g = runs["gated"][:steps]
    out["gated"]["calls_gated_real"] = sum(int(r.get("calls/gated_real") or 0) for r in g)
    out["gated"]["calls_rehearsed"] = sum(int(r.get("calls/rehearsed") or 0) for r in g)
    out["envace"]["calls_rehearsed"] = sum(int(r.get("fidelity/steps") or 0)
                                           for r in runs["envace"][:steps])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gated", nargs="+", required=True, help="gated envace runs, one a seed")
    ap.add_argument("--envace", nargs="+", required=True, help="plain envace runs, same seeds")
    ap.add_argument("--grpo", nargs="+", required=True, help="grpo runs, same seeds")
    ap.add_argument("--seeds", type=int, nargs="+", help="the seeds' numbers, for the record")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--name", default="trust_gate_training_tiny")
    args = ap.parse_args(argv)
    if not len(args.gated) == len(args.envace) == len(args.grpo):
        raise SystemExit("give one run per seed for each of --gated, --envace and --grpo")
    seeds = args.seeds or list(range(len(args.gated)))
    blocks = {str(s): seed_block(a, b, c, args.steps)
              for s, a, b, c in zip(seeds, args.gated, args.envace, args.grpo, strict=True)}
    over: dict[str, Any] = {}
    for k in ("gated", "grpo"):
        per = [b[k]["minus_envace"]["mean"] for b in blocks.values()]
        over[f"{k}_minus_envace"] = {"per_seed": per, "mean": sum(per) / len(per),
                                     "ci": t_interval(per)}
    for s, b in blocks.items():
        print(f"seed {s}: reward gated {b['gated']['mean_reward']:.3f}, envace "
              f"{b['envace']['mean_reward']:.3f}, grpo {b['grpo']['mean_reward']:.3f}; gate sent "
              f"{b['gated']['calls_gated_real']} calls to reality, kept "
              f"{b['gated']['calls_rehearsed']}")
    print("over seeds:", json.dumps(over))
    write_result(args.name, {**run_record("experiments.trust_gate_training", argv,
                                          os.getloadavg()),
                             "steps": args.steps, "seeds": blocks, "over_seeds": over})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
