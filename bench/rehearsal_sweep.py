"""Test-time rehearsal sweep, reported as the paper's table is: N = 0..3 x {parallel,
sequential} x {base, trained} on dev, with 95 % intervals and the tokens each setting spent.

    .venv/bin/python -m bench.rehearsal_sweep --models base=PATH trained=PATH [--tasks 30]
        [--name rehearsal_sweep_tiny] [--max-n 3]

Every setting evaluates the same dev tasks (per-turn) with the same seeds; success is BFCL's
state check of the committed calls. Writes bench/results/<name>.json.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.machine import table, write_result
from envace.eval_cli import select_tasks
from envace.models import load_model
from envace.rehearsal import RehearsalSettings
from envace.rehearsal_eval import evaluate_with_rehearsal


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", required=True, help="label=path")
    ap.add_argument("--tasks", type=int, default=30)
    ap.add_argument("--max-n", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--name", default="rehearsal_sweep")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="envace-sweep-"))
    rows, res = [], {"tasks": args.tasks, "settings": {}}
    for spec in args.models:
        label, path = spec.split("=", 1)
        model, tok = load_model(path)
        tasks = select_tasks("dev", "turn", args.tasks, tok, 4096, args.max_new_tokens, 0)
        grid = [("none", 0)] + [(s, n) for s in ("parallel", "sequential")
                                for n in range(1, args.max_n + 1)]
        for strategy, n in grid:
            s = RehearsalSettings(strategy=strategy, n=n, max_new_tokens=args.max_new_tokens)
            r = evaluate_with_rehearsal(model, tok, tasks, s, out / f"{label}-{strategy}-{n}",
                                        model_name=path)
            key = f"{label}/{strategy}/{n}"
            res["settings"][key] = {k: r[k] for k in ("success_rate", "success_ci", "attempts",
                                                      "budget", "rehearsal_audit",
                                                      "fidelity_vs_success")}
            res["settings"][key]["model"] = path
            ci = r["success_ci"]
            div = (r["rehearsal_audit"] or {}).get("divergence_rate")
            rows.append([label, strategy, n, f"{r['success_rate']:.1%}",
                         f"[{ci[0]:.1%}, {ci[1]:.1%}]",
                         round(r["budget"].get("rehearsal_tokens", 0)),
                         "–" if div is None else f"{div:.1%}"])
            print(table(rows[-1:], ["model", "strategy", "N", "success", "95% CI",
                                    "rehearsal tokens/task", "rehearsal divergence"]),
                  flush=True)
    print(table(rows, ["model", "strategy", "N", "success", "95% CI", "rehearsal tokens/task",
                       "rehearsal divergence"]))
    print("->", write_result(args.name, res))


if __name__ == "__main__":
    main()
