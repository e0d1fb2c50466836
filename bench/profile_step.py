"""Profile one real training step with torch.profiler: the top ops, a chrome trace, the sections.

    .venv/bin/python -m bench.profile_step --config configs/tiny.yaml
    .venv/bin/python -m bench.profile_step --config configs/smollm2.yaml prompts_per_step=1 \\
        group_size=2 max_new_tokens=32 max_turns=2
    .venv/bin/python -m bench.profile_step --config configs/tiny.yaml --sort cpu_time_total

Builds the run's policy and task pool as ``envace train`` does (into ``--out``, default
``runs/profile-<config>``), runs ``--warmup`` plain steps (first-use costs: tokenizer caches,
allocator, lazy imports), then one step under ``torch.profiler`` (CPU, and CUDA when there is a
GPU) with each ``envace.core.timing`` section as a ``record_function`` range. Prints the load
average before and after, each step's ``time/*`` breakdown (the warm-up's is unprofiled; the
profiled step's includes the profiler's overhead) and the top ops table, and writes ``trace.json``
(chrome://tracing or https://ui.perfetto.dev), ``ops.txt`` and ``profile.json`` into the output
folder. Nothing is optimised here: it only says where the time goes (docs/profiling.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _step(step: int, policy: Any, tasks: list, cfg: Any, run_dir: Path, timer: Any
          ) -> tuple[dict[str, Any], dict[str, float]]:
    """One training step timed by ``timer``: its record and its ``time/*`` sections."""
    from envace.training.train import train_step

    record = train_step(step, policy, tasks, cfg, run_dir, timer=timer) or {}
    timer.stop()
    return record, timer.metrics()


def _show(title: str, timing: dict[str, float]) -> None:
    total = timing.get("time/step", 0.0)
    print(f"\n{title}: {total:.2f} s")
    for k, v in sorted(timing.items(), key=lambda kv: -kv[1]):
        if k != "time/step" and v > 0:
            print(f"  {k:<24} {v:8.3f} s  {v / total:6.1%}" if total else f"  {k} {v}")


def by_section(events: Any, names: set[str], top: int = 4) -> dict[str, list[tuple[str, float]]]:
    """Self CPU seconds of each op inside each timed section (the innermost one around it;
    ``python`` is a section's own time outside any op: interpreter work), largest first."""
    acc: dict[str, dict[str, float]] = {}
    for ev in events:
        if ev.name in names:
            sec, op = ev.name, "python"
        else:
            sec, op, p = "outside", ev.name, ev.cpu_parent
            while p is not None and p.name not in names:
                p = p.cpu_parent
            sec = p.name if p is not None else sec
        acc.setdefault(sec, {})
        acc[sec][op] = acc[sec].get(op, 0.0) + ev.self_cpu_time_total / 1e6
    return {sec: sorted(ops.items(), key=lambda kv: -kv[1])[:top] for sec, ops in acc.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/tiny.yaml")
    ap.add_argument("--out", help="output folder (default runs/profile-<config stem>)")
    ap.add_argument("--warmup", type=int, default=1, help="plain steps before the profiled one")
    ap.add_argument("--rows", type=int, default=30, help="rows of the ops table")
    ap.add_argument("--sort", default="self_cpu_time_total",
                    help="ops table order (a torch.profiler key_averages column)")
    ap.add_argument("overrides", nargs="*", help="key=value, as for envace train")
    a = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from envace.core.layout import RUN
    from envace.training.config import TrainConfig, load_config, to_dict
    from envace.training.train import step_timer
    from envace.training.train_setup import build_policy, training_pool

    out = Path(a.out or f"runs/profile-{Path(a.config).stem}")
    cfg = load_config(TrainConfig, a.config,
                      [*a.overrides, f"output_dir={out.parent}", f"run_name={out.name}"])
    run_dir = cfg.run_dir
    for sub in (RUN.rollouts, RUN.audit):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    print(f"[profile] {a.config} -> {run_dir}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load average {load_before}", flush=True)
    policy = build_policy(cfg, run_dir, None, progress=True)
    tasks = training_pool(cfg, policy.tokenizer)
    torch.manual_seed(cfg.seed)
    cuda = torch.cuda.is_available()
    warm: list[dict[str, float]] = []
    for step in range(a.warmup):
        warm.append(_step(step, policy, tasks, cfg, run_dir, step_timer(cfg, policy))[1])
        _show(f"warm-up step {step} (unprofiled)", warm[-1])
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t0 = time.perf_counter()
    with profile(activities=activities, record_shapes=True) as prof:
        rec, profiled = _step(a.warmup, policy, tasks, cfg, run_dir,
                              step_timer(cfg, policy, wrap=record_function))
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    _show(f"profiled step {a.warmup} (profiler overhead included)", profiled)
    table = prof.key_averages().table(sort_by=a.sort, row_limit=a.rows)
    print(f"\n[profile] top ops by {a.sort}:\n{table}")
    from envace.core.timing import STEP_SECTIONS

    sections = by_section(prof.events(), set(STEP_SECTIONS))
    print("[profile] top ops (self CPU s) inside each section:")
    for sec, ops in sorted(sections.items(), key=lambda kv: -sum(v for _, v in kv[1])):
        print(f"  {sec:<18} " + ", ".join(f"{op} {v:.2f}" for op, v in ops))
    trace = run_dir / "trace.json"
    prof.export_chrome_trace(str(trace))
    (run_dir / "ops.txt").write_text(table + "\n")
    tokens = {k: rec.get(k) for k in ("tokens/act", "tokens/rehearse", "tokens/context")}
    (run_dir / "profile.json").write_text(json.dumps({
        "config": a.config, "overrides": a.overrides, "settings": to_dict(cfg),
        "torch": torch.__version__, "threads": torch.get_num_threads(), "cuda": cuda,
        "cpus": os.cpu_count(), "load_before": load_before, "load_after": load_after,
        "date": time.strftime("%F %T"), "warmup": warm, "profiled": profiled,
        "profiled_wall_s": wall, "tokens": tokens,
        "ops_by_section": sections}, indent=1) + "\n")
    print(f"[profile] load average before {load_before}, after {load_after}; tokens {tokens}")
    print(f"[profile] wrote {trace}, {run_dir / 'ops.txt'}, {run_dir / 'profile.json'}")
    policy.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
