"""Benchmark: the generation probe with kept KV caches against the per-step probe (issue #44).

    .venv/bin/python -m bench.probe_prefix                                   # SmolLM2, all dev
    .venv/bin/python -m bench.probe_prefix --fraction 0.1 --seed 0           # a seeded subset
    .venv/bin/python -m bench.probe_prefix --model data/models/tiny-sft --name probe_prefix_tiny

Probes the BFCL dev split's real trajectories (``envace data export-real --split dev``: 120
trajectories, 648 calls; ``--fraction F --seed S``: a seeded sample of that share of the
trajectories) as ``envace probe --model M dev.jsonl --history both`` does, greedy, in one
process on ``--threads`` threads, twice: with each trajectory's KV cache kept across its calls
(the default path, `envace.evaluation.model_probe.kept_answers`) and with every prompt encoded
from scratch (``--no-prefix-cache``, `model_answers`). Both runs load the model once and write
their audit directories under a temporary folder; the step rows of the two are compared (same
rehearsed text, same verdict, same row). Writes ``bench/results/<--name>.json``: the command, the
machine, the load average at the start and end of the whole run and of each path, each path's
wall and process CPU seconds, prompt tokens encoded and reused, the ratios per-step / kept, and
the comparison; per path, the wall time split as `bench.probe_profile` splits it (forwards
of prompt tokens, one-token decode forwards, the rest of generation, the rest of the probe) and
the tokens each kind of forward took and how many forwards of each kind ran (``forwards``;
decode row-tokens over decode forwards is the rows a decode forward carried). The paths run in
``--order`` (default kept first).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.machine import run_record, table, write_result
from bench.probe_profile import Sections, export_dev
from envace.core.layout import AUDIT


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def subset(dev: Path, fraction: float, seed: int, out: Path) -> tuple[Path, list[str]]:
    """A seeded sample of `fraction` of the trajectories of `dev` (file order kept)."""
    lines = [line for line in dev.read_text().splitlines() if line.strip()]
    if fraction >= 1:
        return dev, [json.loads(line)["id"] for line in lines]
    k = max(1, round(fraction * len(lines)))
    keep = sorted(random.Random(seed).sample(range(len(lines)), k))
    out.write_text("".join(lines[i] + "\n" for i in keep))
    return out, [json.loads(lines[i])["id"] for i in keep]


def compare(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """How the step rows of two probes of the same input agree."""
    key = lambda r: (r.get("trajectory_id"), r.get("history"), r.get("step"))  # noqa: E731
    da, db = {key(r): r for r in a}, {key(r): r for r in b}
    both = sorted(set(da) & set(db), key=str)
    text = [k for k in both if da[k].get("rehearsed") != db[k].get("rehearsed")]
    verdict = [k for k in both if da[k].get("diverged") != db[k].get("diverged")]
    return {"rows": [len(a), len(b)], "paired": len(both),
            "identical_rows": sum(da[k] == db[k] for k in both),
            "different_text": len(text), "different_verdict": len(verdict),
            "different_steps": [list(k) for k in text[:20]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--fraction", type=float, default=1.0,
                    help="share of the dev trajectories probed (a seeded sample)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--history", default="both", choices=["real", "own", "both"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--order", default="kept,per_step")
    ap.add_argument("--data", help="a folder holding dev.jsonl (exported when missing)")
    ap.add_argument("--name", default="probe_prefix")
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    import torch

    from audit.scoring.settings import AuditOptions
    from envace.cli.probe import HISTORY_CHOICES
    from envace.evaluation.model_probe import context_length, probe_model
    from envace.model.models import default_cache_dir, load_model, resolve_model

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="probe_prefix-"))
    dev = export_dev(Path(args.data) if args.data else work)
    path_in, ids = subset(dev, args.fraction, args.seed, work / "subset.jsonl")
    path = resolve_model(args.model, default_cache_dir())
    model, tok = load_model(path)
    context = context_length(path, model)
    inner = model.forward  # each path's forwards are timed apart (bench.probe_profile.Sections)
    runs: dict[str, dict[str, Any]] = {}
    rows: dict[str, list[dict[str, Any]]] = {}
    for name in args.order.split(","):
        out = work / name
        sec = Sections()
        model.forward = inner
        sec.wrap_forward(model)
        l0, c0, t0 = os.getloadavg(), _cpu(), time.perf_counter()
        summary = probe_model(model, tok, [str(path_in)], out, AuditOptions(progress=False),
                              context, label=str(path), histories=HISTORY_CHOICES[args.history],
                              prefix_cache=name == "kept", timer=sec)
        wall = time.perf_counter() - t0
        fwd = {k: sec.seconds.get(f"probe/{k}", 0.0) for k in ("prefill", "decode")}
        # streamed (the kept path): the probe advances trajectories inside generation
        gen = sec.seconds.get("probe/generate", 0.0) - sec.seconds.get("probe/advance", 0.0)
        runs[name] = {"wall_s": wall, "cpu_s": _cpu() - c0,
                      "split_s": {**fwd, "generate_other": gen - sum(fwd.values()),
                                  "probe_rest": wall - gen},
                      "forward_tokens": {k: sec.tokens.get(f"probe/{k}", 0)
                                         for k in ("prefill", "decode")},
                      "forwards": {k: sec.calls.get(f"probe/{k}", 0)
                                   for k in ("prefill", "decode")},
                      "load_average": {"start": list(l0), "end": list(os.getloadavg())},
                      "steps": summary["counts"]["steps"],
                      "divergence_rate": summary.get("divergence_rate")}
        rows[name] = [json.loads(line) for line in (out / AUDIT.steps).open()]
        print(f"{name}: {runs[name]['wall_s']:.1f} s wall, {runs[name]['cpu_s']:.1f} s CPU, "
              f"{runs[name]['steps']} rows, load {l0[0]:.1f}", flush=True)
    k, s = runs["kept"], runs["per_step"]
    ratio = {"wall": s["wall_s"] / k["wall_s"], "cpu": s["cpu_s"] / k["cpu_s"]}
    same = compare(rows["kept"], rows["per_step"])
    print(table([[n, r["wall_s"], r["cpu_s"], r["steps"]] for n, r in runs.items()],
                ["path", "wall s", "CPU s", "rows"]))
    print(f"per-step / kept: wall {ratio['wall']:.2f}x, CPU {ratio['cpu']:.2f}x; rows {same}")
    write_result(args.name, {
        **run_record("bench.probe_prefix", argv, load0),
        "model": str(args.model), "history": args.history, "threads": args.threads,
        "fraction": args.fraction, "seed": args.seed, "trajectories": len(ids),
        "trajectory_ids": ids, "runs": runs, "ratio_per_step_over_kept": ratio,
        "comparison": same,
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
