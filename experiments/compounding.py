"""Benchmark: error compounding isolated — the same calls rehearsed with the real history and
with the world model's own (issue #20).

    .venv/bin/python -m experiments.compounding --models "tiny + SFT=data/models/tiny-sft" \
        "smollm2 zero-shot=smollm2" "smollm2 + SFT=.cache/envace/bench-sft-smollm2" \
        --trajectories 24 --max-calls 8 --name compounding_bfcl_dev

For each model, `envace probe --history both` (`envace.evaluation.model_probe.probe_model`) on the
first
`--max-calls` ground-truth calls of `--trajectories` BFCL dev trajectories (a seeded sample of
those with at least 4 calls; the same for every model): every call is rehearsed given the real
responses of the earlier calls and given the model's own earlier answers. The table gives, per
model, divergence with each history, their difference (own - real) with an interval
resampling the family's unit (BFCL: the scenario; ``resampling_unit`` per model), the
induced errors, and the compounding share (own - real) / own overall and at
depth >= 3 (`audit.stats.history`). Writes bench/results/<name>.json (machine, load before and
after, seconds per model, each model's whole `history` block) after every model, and keeps each
audit under --keep; `--collect` rebuilds the table from the audits kept there (a stopped run keeps
the models it finished) without probing again; a model whose audit is already kept there is not
probed again either (`--redo` probes it anew). `--hybrid LABEL ...` probes those models as the
hybrid world model of issue #17 (the lookup's exact answer where the train split made the identical
call, the model elsewhere: `envace probe --hybrid train.jsonl`), the train split exported under
--keep.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.machine import table, write_result
from envace.core.layout import AUDIT


def _sample(n: int, min_calls: int, seed: int) -> list[Any]:
    from envace.core.envs.bfcl.tasks import split_tasks
    from envace.core.export import export_real

    trajs = [t for t in export_real(split_tasks("dev")) if len(t.tool_steps()) >= min_calls]
    rng = random.Random(seed)
    rng.shuffle(trajs)
    return sorted(trajs[:n], key=lambda t: t.id)


def _fmt_pct(v: Any) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def _ci(block: dict[str, Any] | None) -> str:
    ci = (block or {}).get("ci")
    return "n/a" if not ci or ci[0] is None else f"[{ci[0]:+.1%}, {ci[1]:+.1%}]"


def _dirname(label: str) -> str:
    return label.replace(" ", "_").replace("+", "plus").replace("/", "_")


def _report(name: str, info: dict[str, Any], results: dict[str, Any],
            load_start: tuple[float, float, float]) -> None:
    """Print the table and write bench/results/<name>.json for the models done so far."""
    rows = []
    for label, r in results.items():
        h = r["history"] or {}
        o, deep = h.get("overall") or {}, h.get("deep") or {}
        rows.append([label, o.get("n"), _fmt_pct((o.get("real") or {}).get("point")),
                     _fmt_pct((o.get("own") or {}).get("point")),
                     _fmt_pct((o.get("diff") or {}).get("diff")), _ci(o.get("diff")),
                     (o.get("induced") or {}).get("count"),
                     deep.get("n"), _fmt_pct((deep.get("real") or {}).get("point")),
                     _fmt_pct((deep.get("own") or {}).get("point")),
                     _fmt_pct((deep.get("compounding_share") or {}).get("point")),
                     _ci(deep.get("compounding_share"))])
    header = ["model", "calls", "real", "own", "own-real", "95% CI", "induced", "calls d>=3",
              "real d>=3", "own d>=3", "compounding share d>=3", "95% CI"]
    print(table(rows, header))
    path = write_result(name, {**info, "load_average": {"start": load_start,
                                                        "end": os.getloadavg()},
                               "models": results, "table": {"header": header, "rows": rows}})
    print(f"wrote {path}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", required=True, metavar="LABEL=MODEL",
                    help="a label and a model folder (or smollm2)")
    ap.add_argument("--trajectories", type=int, default=24)
    ap.add_argument("--min-calls", type=int, default=4)
    ap.add_argument("--max-calls", type=int, default=8, help="probe each trajectory's first K")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="compounding_bfcl_dev")
    ap.add_argument("--keep", default=None, help="keep each model's audit directory here")
    ap.add_argument("--redo", action="store_true",
                    help="probe models whose audit is already kept under --keep again")
    ap.add_argument("--hybrid", nargs="+", default=[], metavar="LABEL",
                    help="probe these models as the hybrid with a lookup of the train split")
    ap.add_argument("--collect", action="store_true",
                    help="no probing: read the audits already kept under --keep")
    args = ap.parse_args(argv)
    if args.collect and not args.keep:
        ap.error("--collect needs --keep DIR")
    labels = [m.partition("=")[0] for m in args.models]
    if set(args.hybrid) - set(labels):
        ap.error(f"--hybrid names no --models label: {sorted(set(args.hybrid) - set(labels))}")
    trajs = _sample(args.trajectories, args.min_calls, args.seed)
    keep = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="envace-comp-"))
    keep.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    load_start = os.getloadavg()
    command = "python -m experiments.compounding " + " ".join(
        f'"{a}"' if " " in a else a for a in (argv if argv is not None else sys.argv[1:]))
    info = {"split": "dev", "trajectories": [t.id for t in trajs], "max_calls": args.max_calls,
            "min_calls": args.min_calls, "seed": args.seed,
            "max_new_tokens": args.max_new_tokens, "decoding": "greedy", "threads": 1,
            "command": command}
    if args.collect:
        for spec in args.models:
            label = spec.partition("=")[0]
            out = keep / _dirname(label)
            if (out / AUDIT.summary).is_file():
                s = json.loads((out / AUDIT.summary).read_text())
                results[label] = {"model": s.get("audited_model") or spec.partition("=")[2],
                                  "seconds": s.get("seconds"),
                                  "resampling_unit": s.get("resampling_unit"),
                                  "audit": str(out), "history": s.get("history")}
        _report(args.name, info, results, load_start)
        return 0

    import torch

    from audit.scoring.settings import AuditOptions
    from envace.core.schema import TrajectoryWriter
    from envace.evaluation.model_probe import context_length, probe_model
    from envace.model.models import default_cache_dir, load_model, resolve_model

    torch.set_num_threads(1)
    steps = {t.id: range(min(args.max_calls, len(t.tool_steps()))) for t in trajs}
    src = keep / "dev_sample.jsonl"
    with TrajectoryWriter(src, mode="w") as w:
        for t in trajs:
            w.write(t)
    grounding = None
    if args.hybrid:
        from audit.worlds.memory import MemoryOptions, ResponseMemory
        from envace.core.envs.bfcl.tasks import split_tasks
        from envace.core.export import export_real

        train = keep / "train.jsonl"
        with TrajectoryWriter(train, mode="w") as w:
            for t in export_real(split_tasks("train")):
                w.write(t)
        grounding = MemoryOptions(hybrid=ResponseMemory.from_file(train))
    for spec in args.models:
        label, _, model_spec = spec.partition("=")
        out = keep / _dirname(label)
        if (out / AUDIT.summary).is_file() and not args.redo:
            s = json.loads((out / AUDIT.summary).read_text())
            results[label] = {"model": s.get("audited_model") or model_spec,
                              "seconds": s.get("seconds"), "audit": str(out),
                              "resampling_unit": s.get("resampling_unit"),
                              "history": s.get("history"), "kept": True}
            print(f"{label}: kept from {out}", flush=True)
            _report(args.name, info, results, load_start)  # a run of kept models writes too
            continue
        path = resolve_model(model_spec or label, default_cache_dir())
        model, tok = load_model(path)
        t0 = time.perf_counter()
        summary = probe_model(model, tok, [str(src)], out, AuditOptions(progress=False),
                              context_length(path, model), args.max_new_tokens, steps=steps,
                              label=str(path), batch_size=args.batch_size,
                              histories=("real", "own"),
                              grounding=grounding if label in args.hybrid else None)
        results[label] = {"model": summary.get("audited_model") or str(path),
                          "seconds": round(time.perf_counter() - t0, 1),
                          "load_average_after": os.getloadavg(), "audit": str(out),
                          "resampling_unit": summary.get("resampling_unit"),
                          "history": summary.get("history")}
        print(f"{label}: {results[label]['seconds']} s", flush=True)
        _report(args.name, info, results, load_start)  # after every model: nothing lost
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
