"""Benchmark: the likelihood audit against its limit (a bare forward) and the generation probe.

    nice -n 10 .venv/bin/python -m bench.likelihood_speed --model data/models/tiny-sft \
        [--limit 0] [--gen-limit 20] [--name likelihood_speed_tiny] [--reference train.jsonl]
        [--keep DIR]

In one process, torch on one thread, over the real trajectories of the BFCL dev split (or
``--dev FILE``; the first ``--limit``, 0 = all):

1. ``likelihood_audit``: the whole `envace probe --likelihood` run (``probe_likelihood``: the
   environment's replay, the windows, the forwards, the audit directory and its summary);
2. ``likelihood_scoring``: the scorer alone on the same trajectories (the windows, the forwards,
   the fp32 log-softmax at the scored positions), and ``bare_forward``: the decoder alone over
   the same windows in the same batches (no vocabulary projection, no log-softmax): the limit
   the issue sets (goal: scoring within 1.5x of it);
3. ``generation_probe``: the generation probe (greedy, ``--max-new-tokens``) on the first
   ``--gen-limit`` of the same trajectories, compared per call (the full probe of SmolLM2 takes
   hours here).

Wall-clock and CPU seconds (this process's user + system) of each phase; the machine is shared,
so CPU seconds are the figure to compare. Writes bench/results/<--name>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.machine import run_record, table, write_result


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _Clock:
    def __enter__(self) -> _Clock:
        self.w, self.c = time.perf_counter(), _cpu()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall, self.cpu = time.perf_counter() - self.w, _cpu() - self.c


def bare_forward(model: Any, windows: list[Any], batch_size: int, pad: int) -> None:
    """The decoder over ``windows`` in the scorer's batches (length-sorted, right-padded)."""
    import torch

    from envace.model.trained_logits import split_forward

    parts = split_forward(model)
    order = sorted(range(len(windows)), key=lambda i: len(windows[i].ids))
    for a in range(0, len(order), batch_size):
        idx = order[a:a + batch_size]
        width = max(len(windows[i].ids) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        attn = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, :len(windows[i].ids)] = torch.tensor(windows[i].ids)
            attn[row, :len(windows[i].ids)] = 1
        with torch.no_grad():
            if parts is not None:
                parts[0](input_ids=ids, attention_mask=attn, use_cache=False)
            else:
                model(input_ids=ids, attention_mask=attn, use_cache=False)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="data/models/tiny-sft")
    ap.add_argument("--dev", help="real trajectories (default: the real BFCL dev split, "
                                  "exported here)")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--gen-limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--name", default="likelihood_speed")
    ap.add_argument("--reference", help="train-split real trajectories: the audit's compressor "
                                        "reference (its summary's likelihood block is kept)")
    ap.add_argument("--keep", help="write the likelihood audit's directory here (new or empty)")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()

    import torch

    from audit.likelihood_probe import scoring_of
    from audit.probe import probe_trajectory
    from audit.scoring.settings import AuditOptions
    from envace.core.schema import read_trajectories
    from envace.evaluation.likelihood import ModelScorer, Passes, plan_windows, probe_likelihood
    from envace.evaluation.model_probe import context_length, probe_model
    from envace.model.chat import IM_END, marker_id
    from envace.model.models import default_cache_dir, load_model, resolve_model

    torch.set_num_threads(1)
    path = resolve_model(args.model, default_cache_dir())
    model, tok = load_model(path)
    context = context_length(path, model)
    if args.dev:
        trajs = [i.trajectory for i in read_trajectories(args.dev) if i.trajectory is not None]
    else:
        from envace.core.envs.bfcl.tasks import split_tasks
        from envace.core.export import export_real

        trajs = list(export_real(split_tasks("dev")))
    if args.limit:
        trajs = trajs[:args.limit]
    opts = AuditOptions(progress=False, plots=False, reference=args.reference)
    out: dict[str, Any] = {"model": str(path), "context": context, "batch_size": args.batch_size,
                           "trajectories": len(trajs), "torch_threads": 1}
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "dev.jsonl"
        src.write_text("".join(t.to_json() + "\n" for t in trajs))
        with _Clock() as c:
            s = probe_likelihood(model, tok, [str(src)], Path(args.keep or Path(d) / "lk"), opts,
                                 context, batch_size=args.batch_size)
        calls = s["likelihood"]["steps"]
        out["likelihood"] = s["likelihood"]  # the audit's figure (with --reference: deflate's)
        out["likelihood_audit"] = {"seconds": c.wall, "cpu_seconds": c.cpu, "calls": calls,
                                   "passes": s["likelihood_scorer"]["passes"],
                                   "bits_per_byte": s["likelihood"]["bits_per_byte"]["point"]}
        scorings = [scoring_of(t, probe_trajectory(t, lambda *a: "x", opts).steps)
                    for t in trajs]
        scorer = ModelScorer(model, tok, context, args.batch_size)
        with _Clock() as c:
            scorer(scorings)
        out["likelihood_scoring"] = {"seconds": c.wall, "cpu_seconds": c.cpu}
        todo, _ = plan_windows(tok, scorings, context, Passes())
        stop = marker_id(tok, IM_END)
        pad = tok.pad_token_id if tok.pad_token_id is not None else stop
        with _Clock() as c:
            bare_forward(model, [w for _, w in todo], args.batch_size, pad)
        out["bare_forward"] = {"seconds": c.wall, "cpu_seconds": c.cpu,
                               "tokens": sum(len(w.ids) for _, w in todo)}
        gen = trajs[:args.gen_limit] if args.gen_limit else trajs
        gsrc = Path(d) / "gen.jsonl"
        gsrc.write_text("".join(t.to_json() + "\n" for t in gen))
        with _Clock() as c:
            g = probe_model(model, tok, [str(gsrc)], Path(d) / "gen", opts, context,
                            args.max_new_tokens, batch_size=args.batch_size)
        out["generation_probe"] = {"seconds": c.wall, "cpu_seconds": c.cpu,
                                   "trajectories": len(gen), "calls": g["counts"]["steps"],
                                   "max_new_tokens": args.max_new_tokens}
    per = {k: out[k]["cpu_seconds"] / max(1, n) for k, n in (
        ("likelihood_audit", calls), ("generation_probe", out["generation_probe"]["calls"]))}
    out["ratios"] = {
        "scoring_over_bare_forward_cpu": out["likelihood_scoring"]["cpu_seconds"]
        / max(1e-9, out["bare_forward"]["cpu_seconds"]),
        "audit_over_bare_forward_cpu": out["likelihood_audit"]["cpu_seconds"]
        / max(1e-9, out["bare_forward"]["cpu_seconds"]),
        "generation_over_likelihood_cpu_per_call": per["generation_probe"]
        / max(1e-9, per["likelihood_audit"]),
    }
    out["cpu_seconds_per_call"] = per
    out.update(run_record("bench.likelihood_speed", argv, load_start))
    written = write_result(args.name, out)
    print(table([[k, out[k]["seconds"], out[k]["cpu_seconds"]] for k in (
        "likelihood_audit", "likelihood_scoring", "bare_forward", "generation_probe")],
        ["phase", "wall s", "cpu s"]))
    print(json.dumps(out["ratios"], indent=1))
    print(f"wrote {written}")


if __name__ == "__main__":
    main()
