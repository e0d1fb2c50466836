"""The confidence gate measured (issue 42 §2): reward and real calls used by plain real, plain
rehearsal and rehearsal gated at a few thresholds, on the tiny model, BFCL dev.

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python -m experiments.trust_gate [--tasks 20]
        [--n 2] [--model data/models/tiny-sft] [--reward action_partial] [--seed 0]

One process, one model, the same dev tasks (per-turn) and seed for every setting
(``envace.evaluation.rehearsal_eval``, what ``envace eval`` runs): ``real`` (no rehearsal: the
commit alone, in the real environment), ``rehearse`` (N parallel plans the policy answers itself,
then the commit), and ``trust<=C`` (the same plans, a rehearsal below C sent to a private real
environment of the plan: ``--trust-above C``). The thresholds: the lower quartile and the median
of the plain rehearsal's own confidences (mean token log-prob of each rehearsed response; about
25 % and 50 % of its calls fall below them), and the threshold its audit gives for coverage at
<= 5 % divergence (``confidence.coverage_at_risk``). Per setting: success (BFCL's state check of
the commit), the mean commit reward with its paired bootstrap difference to plain rehearsal and to
plain real (task by task), the calls (``calls`` block: real ones by the commits and by the plans,
rehearsed ones), the divergence of the rehearsals the plans kept (their audit, exact match) and
the seconds; the plain rehearsal's audit's confidence headline (AUROC, coverage at risk).
Writes bench/results/trust_gate_tiny.json (load average at start and end) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import run_record, table, write_result
from envace.core.layout import AUDIT, RUN
from envace.evaluation.evaluate import select_tasks
from envace.evaluation.rehearsal_eval import evaluate_with_rehearsal
from envace.model.models import load_model
from envace.model.rehearsal import RehearsalSettings
from envace.model.trust import confidence
from experiments.rehearsal_sweep import paired_diff_ci


def confidences(plans_file: Path) -> list[float]:
    """The rehearsed responses' confidences in a plans file (lookups and truncated ones out)."""
    out = []
    for line in plans_file.read_text().splitlines():
        for m in json.loads(line)["messages"]:
            if m.get("role") == "tool" and m.get("rehearsed") is True and "num_tokens" in m:
                out.append(confidence(m.get("logprob"), m.get("num_tokens")))
    return out


def row(label: str, s: dict[str, Any], seconds: float) -> dict[str, Any]:
    c, audit = s["calls"], s.get("rehearsal_audit") or {}
    return {"kept_rehearsal_divergence": audit.get("divergence_rate"),
            "kept_rehearsal_divergence_ci": audit.get("divergence_ci"),
            "kept_rehearsal_steps": audit.get("steps"),
            "rewards": [a["reward"] for a in s["per_attempt"]], "setting": label,
            "trust_above": c["trust_above"], "success_rate": s["success_rate"],
            "success_ci": s["success_ci"], "reward_mean": s["reward_mean"],
            "real_calls": c["real_total"], "commit_real_calls": c["commit_real"],
            "plan_real_calls": c["plans_real"], "plan_gated_real_calls": c["plans_gated_real"],
            "plan_rehearsed_calls": c["plans_rehearsed"],
            "rehearsal_tokens_per_task": s["budget"].get("rehearsal_tokens", 0.0),
            "seconds": round(seconds, 1), "load_after": list(os.getloadavg())}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="data/models/tiny-sft")
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--n", type=int, default=2, help="parallel plans per task")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--reward", default="action_partial")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    model, tok = load_model(args.model)
    tasks = select_tasks("dev", "turn", args.tasks, tok, 4096, args.max_new_tokens, args.seed)
    base = {"max_new_tokens": args.max_new_tokens, "seed": args.seed}
    rows, audit_conf = [], None
    with tempfile.TemporaryDirectory() as tmp:
        def run(label: str, **kw: Any) -> dict[str, Any]:
            t0 = time.perf_counter()
            s = evaluate_with_rehearsal(model, tok, tasks, RehearsalSettings(**base, **kw),
                                        Path(tmp) / label, reward=args.reward,
                                        model_name=args.model)
            rows.append(row(label, s, time.perf_counter() - t0))
            print(json.dumps(rows[-1]), flush=True)
            return s

        run("real", strategy="none", n=0)
        run("rehearse", strategy="parallel", n=args.n)
        conf = confidences(Path(tmp) / "rehearse" / RUN.plans)
        audit = json.loads((Path(tmp) / "rehearse" / "audit" / AUDIT.summary).read_text())
        audit_conf = {k: audit.get("confidence", {}).get(k) for k in
                      ("steps", "divergence_rate", "auroc", "coverage_at_risk")}
        quartiles = [float(q) for q in np.quantile(conf, [0.25, 0.5, 0.75])] if conf else []
        at5 = ((audit_conf.get("coverage_at_risk") or {}).get("5%") or {}).get("threshold")
        for q in [*quartiles[:2], *([at5] if at5 is not None else [])]:
            run(f"trust>={q:.3f}", strategy="parallel", n=args.n, trust=min(q, 0.0))
    for r in rows:  # task by task (same tasks, same order in every setting)
        for ref in ("rehearse", "real"):
            other = next(x for x in rows if x["setting"] == ref)
            r[f"reward_diff_vs_{ref}"] = paired_diff_ci(other["rewards"], r["rewards"])
    header = ["setting", "success", "reward", "vs rehearse [95% CI]", "real calls (commit + plans)",
              "plan calls gated", "plan calls rehearsed", "kept divergence", "s"]

    def ci(d: dict[str, Any]) -> str:
        return f"{d['mean']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]"

    def div(r: dict[str, Any]) -> str:
        v = r["kept_rehearsal_divergence"]
        return "-" if v is None else f"{v:.2f} of {r['kept_rehearsal_steps']}"

    lines = [[r["setting"], f"{r['success_rate']:.2f}", f"{r['reward_mean']:.3f}",
              ci(r["reward_diff_vs_rehearse"]),
              f"{r['real_calls']} ({r['commit_real_calls']} + {r['plan_real_calls']})",
              r["plan_gated_real_calls"], r["plan_rehearsed_calls"], div(r), r["seconds"]]
             for r in rows]
    print(table(lines, header))
    path = write_result("trust_gate_tiny", {
        **run_record("experiments.trust_gate", argv, load_start),
        "model": args.model, "split": "dev", "unit": "turn", "tasks": len(tasks),
        "task_ids": [t.id for t in tasks], "n": args.n, "reward": args.reward,
        "max_new_tokens": args.max_new_tokens, "seed": args.seed, "threads": os.environ.get(
            "OMP_NUM_THREADS"), "rehearsal_confidence": {
            "steps": len(conf), "quartiles": quartiles,
            "fully_certain": sum(c >= 0 for c in conf)},
        "rehearse_audit_confidence": audit_conf, "rows": rows})
    print(f"-> {path}")


if __name__ == "__main__":
    main()
