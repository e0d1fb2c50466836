"""Does a training run reproduce a recorded one? Its figures against a learning result file's.

    .venv/bin/python -m experiments.reproduce --run runs/prov-envace-s0 --against learning_tiny_dev
    \
        --as runs/learn2-envace --name reproduce_learn2_envace [--note TEXT]

Reads the run as ``experiments.learning`` does (per-step training reward and divergence, first and
last third, the dev evaluation's reward and success, its rehearsals' fidelity) and compares each
figure with the recorded run ``--as`` of ``bench/results/<--against>.json``: bit for bit (``==``)
and by the largest absolute difference. Beside it, the same question asked of the optimizer
directly: torch's fused AdamW (the trainer's since commit 62c7d34) against the default one on the
tiny model's parameter shapes, five steps of the same random gradients, how many weights differ and
by how much. Writes ``bench/results/<--name>.json``. """

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import RESULTS, run_record, write_result
from envace.core.layout import RUN
from experiments.learning import fidelity, per_task, step_rewards


def figures(run: Path) -> dict[str, Any]:
    """The run's figures in ``experiments.learning``'s names."""
    per_step = step_rewards(run)
    k = max(1, len(per_step) // 3)
    metrics = [json.loads(x) for x in (run / RUN.metrics).read_text().splitlines()]
    cur = per_task(run)
    tasks = sorted(cur)  # experiments.learning's order (a float sum's last bit depends on it)
    return {
        "train_reward_by_step": [float(np.mean(x)) for x in per_step],
        "train_divergence_by_step": [m.get("fidelity/divergence_rate") for m in metrics],
        "train_reward_first_third": float(np.mean([r for s in per_step[:k] for r in s])),
        "train_reward_last_third": float(np.mean([r for s in per_step[-k:] for r in s])),
        "dev_reward": float(np.mean([cur[t][0] for t in tasks])),
        "dev_success": float(np.mean([cur[t][1] for t in tasks])),
        "dev_fidelity": fidelity(run),
    }


def _numbers(x: Any) -> list[float]:
    if isinstance(x, dict):
        return [v for k in sorted(x) for v in _numbers(x[k])]
    if isinstance(x, list):
        return [v for e in x for v in _numbers(e)]
    return [float(x)] if isinstance(x, (int, float)) and not isinstance(x, bool) else []


def compare(got: dict[str, Any], recorded: dict[str, Any]) -> dict[str, Any]:
    """Per figure: bit-identical or not, and the largest absolute difference (None where the
    two do not have the same shape)."""
    out = {}
    for key, mine in got.items():
        theirs = recorded.get(key)
        a, b = _numbers(mine), _numbers(theirs)
        out[key] = {"identical": mine == theirs,
                    "max_abs_diff": max((abs(x - y) for x, y in zip(a, b, strict=True)),
                                        default=0.0) if len(a) == len(b) else None}
    return out


def adamw_drift(model: str, steps: int = 5, seed: int = 1) -> dict[str, Any]:
    """Fused against default AdamW on `model`'s parameter shapes: the same start, the same
    random gradients for `steps` steps, lr 3e-4, weight decay 0.01 (the tiny recipe's)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        start = [p.detach().clone()
                 for p in AutoModelForCausalLM.from_pretrained(model).parameters()]

    def run(fused: bool) -> list[Any]:
        g = torch.Generator().manual_seed(seed)
        ps = [torch.nn.Parameter(p.clone()) for p in start]
        opt = torch.optim.AdamW(ps, lr=3e-4, weight_decay=0.01, fused=fused)
        for _ in range(steps):
            for p in ps:
                p.grad = torch.randn(p.shape, generator=g) * 1e-2
            opt.step()
        return ps

    a, b = [[p.detach() for p in run(f)] for f in (True, False)]
    return {"torch": torch.__version__, "tensors": len(start),
            "parameters": sum(p.numel() for p in start), "steps": steps,
            "differing_weights": sum(int((x != y).sum()) for x, y in zip(a, b, strict=True)),
            "max_abs_diff": max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True)),
            "bit_identical": all(torch.equal(x, y) for x, y in zip(a, b, strict=True))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--against", required=True, help="a learning result name (bench/results/)")
    ap.add_argument("--as", dest="as_run", required=True, help="the recorded run's key")
    ap.add_argument("--name", required=True)
    ap.add_argument("--model", default="data/models/tiny-sft", help="for the AdamW check")
    ap.add_argument("--note", default="")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    try:
        recorded = json.loads((RESULTS / f"{args.against}.json").read_text())["runs"][args.as_run]
        got = figures(args.run)
    except (OSError, KeyError, ValueError) as exc:
        print(f"experiments.reproduce: {exc}")
        return 2
    cmp = compare(got, recorded)
    for key, c in cmp.items():
        print(f"{key:<28} identical={c['identical']}  max |diff|={c['max_abs_diff']}")
    drift = adamw_drift(args.model)
    print(f"fused vs default AdamW, {drift['steps']} steps: {drift['differing_weights']} of "
          f"{drift['parameters']} weights differ, max {drift['max_abs_diff']:.3g}")
    path = write_result(args.name, {
        **run_record("experiments.reproduce", argv, load_start), "quiet_machine": None,
        "load_scope": "aggregation",
        "load_not_recorded": "the run's load: envace train does not record it" + (
            f"; {args.note}" if args.note else ""),
        "run": str(args.run), "against": {"result": args.against, "run": args.as_run},
        "recorded_date": json.loads((RESULTS / f"{args.against}.json").read_text())["date"],
        "figures": got, "comparison": cmp,
        "all_identical": all(c["identical"] for c in cmp.values()),
        "adamw_fused_vs_default": drift})
    print("->", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
