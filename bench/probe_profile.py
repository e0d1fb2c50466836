"""Benchmark: where the generation probe's time goes (issue #44 item 1), under `torch.profiler`.

    .venv/bin/python -m bench.probe_profile --model data/models/tiny-sft --limit 4
    .venv/bin/python -m bench.probe_profile --model smollm2 --limit 2 [--no-prefix-cache]

Probes the first ``--limit`` BFCL dev trajectories (``envace data export-real --split dev``) as
``envace probe --model M dev.jsonl --history both`` does (greedy, one thread), with the model's
forward wrapped in a ``record_function`` range named by what it is: ``probe/prefill`` (a forward
of more than one new token per row: a prompt, or forced text on the kept-cache path) or
``probe/decode`` (one token per row). ``probe/generate`` wraps each round's whole generation
(the path's Python around the forwards: HF ``generate``'s loop, or the kept-cache engine's
bookkeeping). Everything else of the wall time is the probe itself: prompt encoding, the real
environment's calls, scoring, writing. Prints the wall-time split (measured by the ranges' own
clocks, not the profiler's per-op overhead) and the top ops per range, and writes
``bench/results/<--name>.json`` (machine, load, the split, the top ops).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.machine import run_record, table, write_result


class Sections:
    """Wall seconds and calls per range, and forward wrappers that fill them."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.tokens: dict[str, int] = {}

    @contextlib.contextmanager
    def section(self, name: str, tokens: int = 0):  # noqa: ANN201 - a context manager
        import torch

        t = time.perf_counter()
        with torch.profiler.record_function(name):
            yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t
        self.calls[name] = self.calls.get(name, 0) + 1
        self.tokens[name] = self.tokens.get(name, 0) + tokens

    def wrap_forward(self, model: Any) -> None:
        """Time every forward of `model` as prefill (> 1 new token per row) or decode."""
        inner = model.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            ids = kwargs.get("input_ids", args[0] if args else None)
            width = int(ids.shape[1]) if ids is not None else 1
            mask = kwargs.get("attention_mask")
            real = int(mask[:, -width:].sum()) if mask is not None else int(ids.numel())
            with self.section("probe/prefill" if width > 1 else "probe/decode", real):
                return inner(*args, **kwargs)

        model.forward = forward


def export_dev(folder: Path) -> Path:
    """The BFCL dev split's real trajectories, written by ``envace data export-real``."""
    out = folder / "dev.jsonl"
    if not out.is_file():
        subprocess.run([sys.executable, "-m", "envace.cli", "data", "export-real", "--split",
                        "dev", "--out", str(out)], check=True, capture_output=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="data/models/tiny-sft")
    ap.add_argument("--limit", type=int, default=4, help="dev trajectories probed")
    ap.add_argument("--history", default="both", choices=["real", "own", "both"])
    ap.add_argument("--no-prefix-cache", action="store_true",
                    help="the per-step path (every prompt encoded from scratch)")
    ap.add_argument("--rows", type=int, default=12, help="top ops listed per range")
    ap.add_argument("--name", default="probe_profile")
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    import torch

    from envace.cli.probe import HISTORY_CHOICES
    from envace.evaluation.model_probe import context_length, probe_model
    from envace.model.models import default_cache_dir, load_model, resolve_model

    torch.set_num_threads(1)
    path = resolve_model(args.model, default_cache_dir())
    model, tok = load_model(path)
    context = context_length(path, model)
    sec = Sections()
    sec.wrap_forward(model)
    work = Path(tempfile.mkdtemp(prefix="probe_profile-"))
    from audit.scoring.settings import AuditOptions

    dev = export_dev(work)
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        summary = probe_model(model, tok, [str(dev)], work / "out", AuditOptions(progress=False),
                              context, limit=args.limit, label=str(path),
                              histories=HISTORY_CHOICES[args.history],
                              prefix_cache=not args.no_prefix_cache, timer=sec)
    wall = time.perf_counter() - t0
    gen = sec.seconds.get("probe/generate", 0.0)
    fwd = {k: sec.seconds.get(k, 0.0) for k in ("probe/prefill", "probe/decode")}
    split = {"prefill_s": fwd["probe/prefill"], "decode_s": fwd["probe/decode"],
             "generate_python_s": gen - sum(fwd.values()), "probe_rest_s": wall - gen,
             "wall_s": wall}
    print(table([[k, v, v / wall] for k, v in split.items()], ["part", "seconds", "share"]))
    print({k: (sec.calls[k], sec.tokens[k]) for k in sec.calls})
    averages = prof.key_averages()
    top = sorted(averages, key=lambda e: -e.self_cpu_time_total)[: args.rows]
    ops = [{"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "calls": e.count} for e in top]
    print(table([[o["op"][:48], o["self_s"], o["calls"]] for o in ops],
                ["op (self CPU, all ranges)", "s", "calls"]))
    write_result(args.name, {
        **run_record("bench.probe_profile", argv, load0),
        "model": str(args.model), "trajectories": args.limit, "history": args.history,
        "path": "per_step" if args.no_prefix_cache else "prefix_cache",
        "steps": summary["counts"]["steps"], "split": split,
        "forwards": {k: {"calls": sec.calls[k], "tokens": sec.tokens[k],
                         "seconds": sec.seconds[k]} for k in sec.calls},
        "top_ops": ops, "threads": 1,
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
