"""Rehearsal sweeps of several sampling seeds, pooled: does rehearsal change the commit's reward,
and does it matter who answers the plans (no model runs; reads ``bench/results/<name>.json``).

    .venv/bin/python -m experiments.sweep_seeds rehearsal_sweep_tiny rehearsal_worlds_tiny_s0 \\
        rehearsal_worlds_tiny_s1 rehearsal_worlds_tiny_s2 --name rehearsal_worlds_tiny

Each input is one ``experiments.rehearsal_sweep`` result; its ``seed`` (0 when absent: sweeps made
before ``--seed`` existed) says which sampling seed it ran. Several files may hold one seed (a
sweep resumed under another name): a setting present in two of them must hold the same attempts,
or the files are refused. Every setting is compared with the same seed's no-rehearsal run, task
by task, and the differences of all seeds are pooled: their mean, with a 95 % interval from a
bootstrap that resamples **tasks** (a task's seeds move together: they share its difficulty;
``pooled``, no interval where every task's difference is the same). Worlds are also compared
with each other at the same strategy and N (``--versus oracle:self`` and the like): the paired
difference of the two settings' rewards on the same task and seed, pooled the same way. Writes
``bench/results/<name>.json`` and prints the markdown table of ``docs/results.md``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from typing import Any

import numpy as np

from audit.stats.intervals import cluster_codes
from bench.machine import RESULTS, run_record, write_result


def split_key(key: str) -> tuple[str, str, int, str]:
    """``label/strategy/N[/world]`` -> (label, strategy, N, world); no world is ``self``."""
    label, strategy, n, *world = key.split("/")
    return label, strategy, int(n), world[0] if world else "self"


def attempts(setting: dict[str, Any]) -> dict[str, float]:
    """Task -> the commit's reward (one attempt per task and seed in a sweep)."""
    out: dict[str, float] = {}
    for a in setting["per_attempt"]:
        if a["task"] in out:
            raise ValueError(f"task {a['task']} has two attempts in one setting")
        out[a["task"]] = float(a["reward"])
    return out


def by_seed(results: list[dict[str, Any]]) -> dict[int, dict[str, dict[str, float]]]:
    """Seed -> setting key -> task -> reward, from sweeps of the same tasks and lengths."""
    out: dict[int, dict[str, dict[str, float]]] = defaultdict(dict)
    shape = None
    for res in results:
        s = tuple(res.get(k) for k in ("tasks", "reward", "max_turns", "max_new_tokens"))
        if shape is not None and s != shape:
            raise ValueError(f"sweeps of different settings: {s} and {shape}")
        shape = s
        seed = int(res.get("seed", 0))
        for key, setting in res["settings"].items():
            got = attempts(setting)
            old = out[seed].get(key)
            if old is not None and old != got:
                raise ValueError(f"seed {seed}, {key}: two files disagree on its attempts")
            out[seed][key] = got
    return dict(out)


def pooled(pairs: list[tuple[str, float]], resamples: int = 5000, seed: int = 0,
           level: float = 0.95) -> dict[str, Any]:
    """Mean of (task, difference) pairs with a percentile interval from a bootstrap of tasks
    (a resampled task brings all its seeds). Where the replicates have no spread (every task's
    mean difference equal) there is no interval: a zero-width one would claim a certainty that
    30 tasks cannot give, and a rate's fallback would not fit a difference."""
    codes, _ = cluster_codes([t for t, _ in pairs])
    sums = np.bincount(codes, weights=[d for _, d in pairs])
    counts = np.bincount(codes).astype(float)
    mean = float(sums.sum() / counts.sum())
    out: dict[str, Any] = {"mean": mean, "ci": None, "method": "task_bootstrap",
                           "n": len(pairs), "tasks": len(sums)}
    draw = np.random.default_rng(seed).integers(0, len(sums), (resamples, len(sums)))
    reps = sums[draw].sum(axis=1) / counts[draw].sum(axis=1)
    if float(reps.max() - reps.min()) <= 1e-12:
        out["method"] = "no spread: every task's difference is the same; no interval"
        return out
    alpha = (1 - level) / 2
    lo, hi = (float(v) for v in np.quantile(reps, [alpha, 1 - alpha]))
    out["ci"] = [min(lo, mean), max(hi, mean)]
    return out


def differences(seeds: dict[int, dict[str, dict[str, float]]], key: str, base: str
                ) -> tuple[list[tuple[str, float]], list[int], dict[int, float]]:
    """(task, reward under key − under base) for every seed holding both, the seeds used,
    and each seed's mean difference."""
    pairs: list[tuple[str, float]] = []
    used, means = [], {}
    for seed, settings in sorted(seeds.items()):
        if key not in settings or base not in settings:
            continue
        a, b = settings[base], settings[key]
        if set(a) != set(b):
            raise ValueError(f"seed {seed}: {key} and {base} ran different tasks")
        d = [(t, b[t] - a[t]) for t in sorted(a)]
        pairs += d
        used.append(seed)
        means[seed] = sum(x for _, x in d) / len(d)
    return pairs, used, means


def summarise(seeds: dict[int, dict[str, dict[str, float]]], versus: list[tuple[str, str]]
              ) -> dict[str, Any]:
    """Every rehearsal setting against no rehearsal, and the asked world pairs."""
    keys = sorted({k for s in seeds.values() for k in s}, key=lambda k: (
        split_key(k)[0], split_key(k)[3] != "self", split_key(k)[3], split_key(k)[1],
        split_key(k)[2]))
    out: dict[str, Any] = {"vs_none": {}, "versus": {}}
    for key in keys:
        label, strategy, n, world = split_key(key)
        if strategy == "none":
            continue
        pairs, used, means = differences(seeds, key, f"{label}/none/0")
        if pairs:
            out["vs_none"][key] = {**pooled(pairs), "seeds": used, "per_seed": means,
                                   "world": world}
    for a, b in versus:
        for key in keys:
            label, strategy, n, world = split_key(key)
            if world != a or strategy == "none":
                continue
            other = f"{label}/{strategy}/{n}" + ("" if b == "self" else f"/{b}")
            pairs, used, means = differences(seeds, key, other)
            if pairs:
                out["versus"][f"{key} - {other}"] = {**pooled(pairs), "seeds": used,
                                                     "per_seed": means}
    return out


def _fmt(r: dict[str, Any]) -> str:
    ci = r.get("ci")
    text = f"{r['mean']:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")
    return f"**{text}**" if ci and (ci[0] > 0 or ci[1] < 0) else text


def markdown(summary: dict[str, Any]) -> str:
    lines = ["| model | world | rehearsal | N | reward − none, pooled (95 % CI, tasks "
             "resampled) | per seed | seeds |", "|---|---|---|---|---|---|---|"]
    for key, r in summary["vs_none"].items():
        label, strategy, n, world = split_key(key)
        per = " / ".join(f"{v:+.3f}" for v in r["per_seed"].values())
        lines.append(f"| {label} | {world} | {strategy} | {n} | {_fmt(r)} | {per} | "
                     f"{len(r['seeds'])} |")
    if summary["versus"]:
        lines += ["", "| comparison (same task and seed) | reward difference, pooled (95 % CI) "
                  "| per seed | seeds |", "|---|---|---|---|"]
        for key, r in summary["versus"].items():
            per = " / ".join(f"{v:+.3f}" for v in r["per_seed"].values())
            lines.append(f"| {key} | {_fmt(r)} | {per} | {len(r['seeds'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="+", help="sweep results (bench/results/<name>.json)")
    ap.add_argument("--versus", action="append", default=[], metavar="WORLD:WORLD",
                    help="compare two worlds at each strategy and N (e.g. oracle:self)")
    ap.add_argument("--name", default="rehearsal_sweep_seeds")
    args = ap.parse_args(argv)
    try:
        versus = [tuple(v.split(":", 1)) for v in args.versus]
        if any(len(v) != 2 for v in versus):
            raise ValueError("--versus takes WORLD:WORLD")
        results = [json.loads((RESULTS / f"{n}.json").read_text()) for n in args.names]
        summary = summarise(by_seed(results), versus)  # type: ignore[arg-type]
    except (OSError, ValueError, KeyError) as exc:
        print(f"experiments.sweep_seeds: {exc}")
        return 2
    print(markdown(summary))
    record = {**run_record("experiments.sweep_seeds", argv, os.getloadavg()), "quiet_machine": None}
    path = write_result(args.name, {**record, "load_scope": "aggregation",
                                    "measured_in": list(args.names), "inputs": args.names,
                                    **summary})
    print("->", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
