"""Benchmark: the model presets as actors and as world models, before and after the SFT cold start.

    .venv/bin/python -m experiments.presets                      # trains what is missing (~20 min)
    .venv/bin/python -m experiments.presets --tiny-sft DIR --smollm2-sft DIR --steps 150
    .venv/bin/python -m experiments.presets --only "tiny (untrained)" "tiny + SFT" --free-running
    120 .venv/bin/python -m experiments.presets --extra "tiny 30 min=data/models/tiny-sft"

On a fixed random sample of dev steps (same for every model; scenario-level held-out split), each
model is probed one step at a time on the *real* history:

- act: given the history up to a ground-truth call, it writes the assistant turn greedily; we
  count the steps where a call parses and where it is the ground-truth call (name + arguments);
- rehearse (teacher-forced, `audit.probe`): given the history including the call, it writes the
  tool response; scored against the real response with the audit's `exact` and `json_f1`.

Shares and the json_f1 mean carry 95 % intervals that resample the sampled steps' trajectories
(`audit.stats.intervals.cluster_ratio`: steps of one trajectory are not independent);
rehearsal skill against the lookup / majority reference world models (built from the train
split) carries a paired bootstrap interval over trajectories; trained tiny vs untrained tiny is a
paired bootstrap difference. With `--free-running N`, each model also rolls out N dev tasks on
its own (`envace rollout --mode rehearse --unit task`) and `envace-audit replay` scores what it
rehearsed. Rows not measured in a run are kept from the previous results when the sampled
steps are the same. Missing SFT checkpoints are trained by the project's own command
(`envace sft`) in a subprocess, so the recorded wall time is the command's. Writes
bench/results/presets.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from audit.scoring.scorers import ScoreContext, score_step
from audit.scoring.settings import AuditOptions
from audit.stats.intervals import cluster_ratio
from audit.worlds.reference import build_reference, skill_with_ci
from bench.machine import RESULTS, table, write_result
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.core.layout import AUDIT, RUN
from envace.core.schema import TrajectoryWriter

SCORERS = ["exact", "json_f1", "error_agreement"]
REFS = ("lookup", "majority")
ROWS = ("tiny (untrained)", "tiny + SFT", "smollm2 zero-shot", "smollm2 + SFT")


def sample_steps(trajs: list[Any], n: int, seed: int) -> dict[str, list[int]]:
    """A fixed uniform sample of `n` (trajectory, step) pairs, as {trajectory id: steps}."""
    pairs = [(t.id, s.step) for t in trajs for s in t.tool_steps()]
    chosen = sorted(random.Random(seed).sample(pairs, min(n, len(pairs))))
    out: dict[str, list[int]] = {}
    for tid, step in chosen:
        out.setdefault(tid, []).append(step)
    return out


def cluster_of_id(trajectory_id: str) -> str:
    """The resampling cluster of a sampled step's trajectory (``real-<task id>``, as
    ``envace data export-real`` names them): BFCL's scenario, its four category variants
    together (``envace.core.envs.units``; issue 38); any other id is its own cluster."""
    from envace.core.envs.units import scenario_of

    tid = str(trajectory_id)
    return scenario_of(tid[len("real-"):] if tid.startswith("real-") else tid)


def share(flags: list[Any], groups: list[str]) -> dict[str, Any]:
    """How many of the sampled steps have the flag, with a trajectory-bootstrap interval."""
    r = cluster_ratio([float(bool(f)) for f in flags], groups)
    return {"k": sum(bool(f) for f in flags), "n": len(flags), "rate": r["point"],
            "ci": r["ci"] or [None, None], "method": r["method"]}


def cluster_mean(values: list[float], groups: list[str]) -> dict[str, Any]:
    """Mean with a trajectory-bootstrap interval (the audit summary's ``scores`` layout)."""
    r = cluster_ratio(values, groups)
    return {"mean": r["point"], "ci": r["ci"], "n": r["n"], "method": r["method"]}


def paired_diff(a: list[float], b: list[float], groups: list[str], n_boot: int = 2000,
                seed: int = 0) -> dict[str, Any]:
    """mean(a) - mean(b) on the same steps, with a bootstrap CI resampling trajectories."""
    x, y = np.asarray(a, float), np.asarray(b, float)
    _, codes = np.unique(np.asarray(groups), return_inverse=True)
    g = codes.max() + 1
    sx, sy = np.bincount(codes, x, g), np.bincount(codes, y, g)
    size = np.bincount(codes, minlength=g).astype(float)
    idx = np.random.default_rng(seed).integers(0, g, size=(n_boot, g))
    d = (sx[idx].sum(1) - sy[idx].sum(1)) / size[idx].sum(1)
    lo, hi = np.quantile(d, [0.025, 0.975])
    return {"diff": float(x.mean() - y.mean()), "ci": [float(lo), float(hi)],
            "significant": bool(lo > 0 or hi < 0)}


def report(results: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The table, the paired trained-vs-untrained comparison and the reference rows."""
    any_res = next(iter(results.values()))
    ref_rows = {n: {s: any_res["skill"][n][s]["f_ref"] for s in ("exact", "json_f1")}
                for n in REFS}
    # every trained tiny against the untrained one, paired on the same steps
    comparison: dict[str, Any] = {}
    base = results.get(ROWS[0])
    for name, res in results.items():
        if base is None or name == ROWS[0] or not name.startswith("tiny"):
            continue
        a, b = res["per_step"], base["per_step"]
        groups = [cluster_of_id(tid) for tid, _ in a["ids"]]
        comparison[name] = {
            key: paired_diff([float(x) for x in a[key]], [float(x) for x in b[key]], groups)
            for key in ("parsed_call", "exact_call", "rehearse_exact", "rehearse_json_f1")}

    header = ["model", "params", "parse call", "exact call", "rehearse exact", "json_f1",
              "skill exact vs lookup", "skill json_f1 vs lookup", "free-run exact (steps)",
              "SFT s", "SFT tok/s"]

    def pct(x: dict) -> str:
        return f"{x['rate']:.1%} [{x['ci'][0]:.0%}, {x['ci'][1]:.0%}]"

    def sk(x: dict) -> str:
        if x["point"] is None:
            return "n/a"
        lo = "?" if x["lo"] is None else f"{x['lo']:+.2f}"
        hi = "?" if x["hi"] is None else f"{x['hi']:+.2f}"
        return f"{x['point']:+.2f} [{lo}, {hi}]"

    def free(x: dict | None) -> str:
        if not x:
            return "-"
        if "error" in x or not (x.get("exact") or {}).get("n"):
            return "n/a" if "error" not in x else "failed"
        return f"{x['exact']['mean']:.1%} ({x['exact']['n']})"

    rows = []
    for name, r in results.items():
        f1 = r["rehearse_json_f1"]
        rows.append([name, f"{r['num_parameters'] / 1e6:.1f}M", pct(r["parsed_call"]),
                     pct(r["exact_call"]), pct(r["rehearse_exact"]),
                     f"{f1['mean']:.3f} [{f1['ci'][0]:.2f}, {f1['ci'][1]:.2f}]",
                     sk(r["skill"]["lookup"]["exact"]), sk(r["skill"]["lookup"]["json_f1"]),
                     free(r.get("free_running")),
                     (r.get("sft") or {}).get("wall_seconds", "-"),
                     (r.get("sft") or {}).get("tokens_per_s", "-")])
    for ref_name, v in ref_rows.items():
        rows.append([f"reference: {ref_name}", "-", "-", "-", f"{v['exact']:.1%}",
                     f"{v['json_f1']:.3f}", "0", "0", "-", "-", "-"])
    text = table(rows, header)
    print(text)
    for name, diffs in comparison.items():
        for key, v in diffs.items():
            print(f"{name} minus untrained, {key}: {v['diff']:+.3f} "
                  f"[{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]" + (" *" if v["significant"] else ""))
    return text, comparison, ref_rows


def recompute_intervals(path: Path) -> dict[str, Any]:
    """Every rate's and mean's interval from the stored per-step figures (no model runs): the
    models' shares and json_f1 means with trajectory-bootstrap intervals, and the paired
    comparison again. ``tool_name_match`` has no per-step record and keeps what it had."""
    load0 = os.getloadavg()
    res = json.loads(path.read_text())
    for r in res["models"].values():
        ps = r["per_step"]
        groups = [cluster_of_id(tid) for tid, _ in ps["ids"]]
        for key in ("parsed_call", "exact_call", "rehearse_exact"):
            r[key] = share(ps[key], groups)
        r["rehearse_json_f1"] = cluster_mean([float(x) for x in ps["rehearse_json_f1"]], groups)
    ref_scores = sampled_reference_scores([tuple(i) for i in next(iter(
        res["models"].values()))["per_step"]["ids"]])
    for r in res["models"].values():
        r["skill"] = recompute_skill(r, ref_scores)
    text, comparison, _ = report(res["models"])
    res["table"], res["tiny_sft_vs_untrained"] = text, comparison
    res["history"] = [*res.get("history", []), {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": ["python", "-m", "experiments.presets", "--recompute-intervals"],
        "load_average": {"start": list(load0), "end": list(os.getloadavg())},
        "note": "intervals recomputed from the stored per-step figures: a cluster bootstrap "
                "resampling BFCL scenarios (issue 38; before it, trajectories; before #13, "
                "Wilson/t over steps); points unchanged; the skill column's interval too "
                "(2026-12-05: the reference world models' per-step scores rebuilt from the train "
                "and dev exports, no model run; each point checked against the stored one)"}]
    return res


def sampled_reference_scores(ids: list[tuple[str, int]]) -> dict[str, dict[str, list[float]]]:
    """Each reference world model's (`REFS`, built from the train split's real trajectories)
    ``exact`` and ``json_f1`` scores on the sampled dev steps `ids` ((trajectory id, step)
    pairs, in order), scored against the recorded real response as the probe scores a model:
    what `evaluate` computes beside a model, without the model."""
    from audit.pipeline import reference_triples

    dev = {t.id: {st.step: st for st in t.tool_steps()} for t in export_real(split_tasks("dev"))}
    with tempfile.TemporaryDirectory() as tmp:
        train_file = Path(tmp) / "train.jsonl"
        with TrajectoryWriter(train_file, mode="w") as w:
            for t in export_real(split_tasks("train")):
                w.write(t)
        triples = reference_triples(train_file)
    refs = {n: build_reference(n, triples) for n in REFS}
    out: dict[str, dict[str, list[float]]] = {n: {"exact": [], "json_f1": []} for n in REFS}
    for tid, step in ids:
        st = dev[tid][step]
        args = st.arguments if isinstance(st.arguments, dict) else {}
        actual = st.response.content or "" if st.response else ""
        for n, ref in refs.items():
            sc = score_step(ref(st.tool, args), actual, ScoreContext(tool=st.tool),
                            ["exact", "json_f1"])
            for k in ("exact", "json_f1"):
                out[n][k].append(sc[k])
    return out


def recompute_skill(r: dict[str, Any], ref_scores: dict[str, dict[str, list[float]]]
                    ) -> dict[str, Any]:
    """A model row's skill against each reference with the cluster bootstrap (BFCL scenarios),
    from its stored per-step scores and the references' (`sampled_reference_scores`). The
    point must be the stored one (ValueError otherwise: the rebuilt references would not be
    the ones measured)."""
    ps = r["per_step"]
    groups = [cluster_of_id(tid) for tid, _ in ps["ids"]]
    model = {"exact": [float(x) for x in ps["rehearse_exact"]],
             "json_f1": [float(x) for x in ps["rehearse_json_f1"]]}
    out: dict[str, Any] = {}
    for n, scores in ref_scores.items():
        out[n] = {}
        for k in ("exact", "json_f1"):
            new = skill_with_ci(model[k], scores[k], groups=groups, n_boot=2000, seed=0)
            old = (r.get("skill") or {}).get(n, {}).get(k) or {}
            tol = 1e-9 if k == "exact" else 5e-3  # json_f1 per step is stored rounded to 4 places
            if old.get("point") is not None and abs(new["point"] - old["point"]) > tol:
                raise ValueError(f"skill {k} vs {n}: rebuilt point {new['point']} is not the "
                                 f"stored {old['point']}")
            out[n][k] = {**new, "resampling_unit": "scenario",
                         "trajectory_interval": [old.get("lo"), old.get("hi")]}
    return out


def train_sft(preset: str, out: Path, extra: list[str]) -> Path:
    """Run `envace sft` as a subprocess (its own wall clock; reused when up to date)."""
    cmd = [sys.executable, "-m", "envace.cli", "sft", "--preset", preset, "--out", str(out),
           "--quiet", *extra]
    print("$", " ".join(cmd[1:]), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"envace sft failed:\n{r.stderr[-3000:]}")
    print(r.stdout.strip(), flush=True)
    return out


def per_step(act: list[dict], rows: list[dict]) -> dict[str, list]:
    """Per sampled step, in one order: what paired comparisons between models need."""
    by_key = {(r["trajectory_id"], r["step"]): r for r in rows}
    keys = [(a["trajectory_id"], a["step"]) for a in act]
    assert set(keys) == set(by_key), "act and rehearse probes saw different steps"
    return {
        "ids": [list(k) for k in keys],
        "parsed_call": [int(a["parsed_call"]) for a in act],
        "exact_call": [int(a["exact_call"]) for a in act],
        "rehearse_exact": [by_key[k]["scores"]["exact"] for k in keys],
        "rehearse_json_f1": [round(by_key[k]["scores"]["json_f1"], 4) for k in keys],
    }


def evaluate(name: str, path: Path, context: int, dev: list[Any], dev_file: Path,
             steps: dict[str, list[int]], refs: dict[str, Any], args: argparse.Namespace,
             keep: Path | None) -> dict[str, Any]:
    from envace.evaluation.model_probe import act_probe, act_requests, probe_model
    from envace.model.models import load_model

    model, tok = load_model(path)
    t0 = time.perf_counter()
    act = act_probe(model, tok, act_requests(dev, steps), context, args.act_tokens, args.batch)
    t_act = time.perf_counter() - t0
    out_dir = (keep / name) if keep else Path(tempfile.mkdtemp(prefix=f"probe-{name}-"))
    opts = AuditOptions(scorers=list(SCORERS), progress=False, plots=keep is not None)
    t0 = time.perf_counter()
    probe_model(model, tok, [str(dev_file)], out_dir, opts, context, args.rehearse_tokens,
                steps=steps, label=name, batch_size=args.batch)
    t_reh = time.perf_counter() - t0
    rows = [json.loads(x) for x in (out_dir / AUDIT.steps).read_text().splitlines()]
    n = len(rows)
    groups = [r["trajectory_id"] for r in rows]
    act_groups = [a["trajectory_id"] for a in act]
    res: dict[str, Any] = {
        "model": str(path),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "context": context,
        "steps": n,
        "parsed_call": share([r["parsed_call"] for r in act], act_groups),
        "tool_name_match": share([r["name_match"] for r in act], act_groups),
        "exact_call": share([r["exact_call"] for r in act], act_groups),
        "rehearse_exact": share([int(r["scores"]["exact"]) for r in rows], groups),
        "rehearse_json_f1": cluster_mean([r["scores"]["json_f1"] for r in rows], groups),
        "skill": {},
        "seconds": {"act_probe": round(t_act, 1), "rehearse_probe": round(t_reh, 1)},
        "examples": [{"step": r["step"], "tool": r["tool"], "actual": r["actual"][:160],
                      "rehearsed": r["rehearsed"][:160]} for r in rows[:3]],
        "act_examples": [a["generated"][:200] for a in act[:3]],
        "per_step": per_step(act, rows),
    }
    for ref_name, ref in refs.items():
        ref_scores = {s: [] for s in ("exact", "json_f1")}
        for r in rows:
            text = ref(r["tool"], r["arguments"] if isinstance(r["arguments"], dict) else {})
            sc = score_step(text, r["actual"], ScoreContext(tool=r["tool"]), ["exact", "json_f1"])
            for s in ref_scores:
                ref_scores[s].append(sc[s])
        res["skill"][ref_name] = {
            s: skill_with_ci([r["scores"][s] for r in rows], ref_scores[s], groups=groups,
                             n_boot=2000, seed=0)
            for s in ref_scores
        }
    if not keep:
        import shutil

        shutil.rmtree(out_dir, ignore_errors=True)
    del model
    return res


def free_running(path: Path, tasks: int, train_file: Path, work: Path, ctx: int,
                 threads: int) -> dict[str, Any]:
    """Free-running fidelity: `envace rollout --mode rehearse` on dev tasks, then the audit.

    The model acts and rehearses on its own from each task's first turn (`--unit task`;
    sampling as `envace rollout` defaults, seed 0); an episode ends at a malformed call or an
    unknown tool, so weak models leave few answered steps;
    `envace-audit replay` pairs each rehearsed response with the real one. Returns the audit's
    counts, divergence of the rehearsed steps (trajectory-bootstrap CI), exact and json_f1 means
    and skill against the references.
    """
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    roll = work / "rollouts.jsonl"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "envace.cli", "rollout", "--model", str(path),
                        "--split", "dev", "--mode", "rehearse", "--unit", "task",
                        "--tasks", str(tasks),
                        "--max-context", str(ctx), "--out", str(roll)],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {"error": f"envace rollout failed: {r.stderr[-800:]}"}
    t_roll = time.perf_counter() - t0
    audit_dir = work / RUN.audit
    r = subprocess.run([sys.executable, "-m", "audit.cli", "--quiet", "replay", str(roll),
                        "--reference", str(train_file), "--scorers", *SCORERS,
                        "--out", str(audit_dir)], capture_output=True, text=True, env=env)
    if r.returncode not in (0, 3):
        return {"error": f"envace-audit replay failed: {r.stderr[-800:]}"}
    s = json.loads((audit_dir / AUDIT.summary).read_text())
    c = s["counts"]
    sk = (s.get("skill") or {}).get("by_scorer") or {}
    return {
        "tasks": tasks, "trajectories": c["trajectories"], "steps": c["steps"],
        "answered_steps": c["answered_steps"], "malformed_calls": c["malformed_calls"],
        "rehearsed_steps": c.get("scored_steps"),
        "divergence_rate": s.get("divergence_rate"), "divergence_ci": s.get("divergence_ci"),
        "by_source": s.get("by_source"),
        "exact": (s.get("scores") or {}).get("exact"),
        "json_f1": (s.get("scores") or {}).get("json_f1"),
        "skill": {k: {x: v.get(x) for x in ("point", "lo", "hi", "best_reference", "f_ref")}
                  for k, v in sk.items() if k in ("exact", "json_f1")},
        "rollout_seconds": round(t_roll, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=150, help="dev steps sampled (same for all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny-sft", help="trained tiny folder (default: run `envace sft`)")
    ap.add_argument("--smollm2-sft", help="trained smollm2 folder (default: run `envace sft`)")
    ap.add_argument("--smollm2-sft-args", default="--max-minutes 10 --seq-len 1024",
                    help="flags of the smollm2 SFT run when it must be trained")
    ap.add_argument("--tiny-sft-args", default="", help="flags of the tiny SFT run")
    ap.add_argument("--only", nargs="+", choices=ROWS, default=None,
                    help="evaluate only these rows (the others kept from the last results)")
    ap.add_argument("--extra", nargs="+", default=[], metavar="LABEL=PATH",
                    help="more trained folders to evaluate (e.g. a longer-trained checkpoint)")
    ap.add_argument("--act-tokens", type=int, default=128)
    ap.add_argument("--rehearse-tokens", type=int, default=160)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = auto)")
    ap.add_argument("--free-running", type=int, default=0, metavar="TASKS",
                    help="also roll out this many dev tasks per model and audit them (0: skip)")
    ap.add_argument("--keep", help="keep each model's probe audit directory under this folder")
    ap.add_argument("--recompute-intervals", action="store_true",
                    help="recompute the intervals of bench/results/presets.json from its stored "
                         "per-step figures, without running any model")
    args = ap.parse_args()
    if args.recompute_intervals:
        res = recompute_intervals(RESULTS / "presets.json")
        print(res["table"])
        print("->", write_result("presets", {k: v for k, v in res.items()
                                            if k not in ("benchmark", "date", "machine")}))
        return
    load0 = os.getloadavg()
    t_start = time.perf_counter()
    import torch

    from envace.model.models import auto_threads

    threads = auto_threads(args.threads)
    torch.set_num_threads(threads)

    from audit.pipeline import reference_triples
    from envace.model.models import default_cache_dir, read_sft_meta, resolve_model
    from envace.training.sft import training_texts

    train = list(export_real(split_tasks("train")))
    dev = list(export_real(split_tasks("dev")))
    scratch = Path(tempfile.mkdtemp(prefix="bench-presets-"))
    dev_file, train_file = scratch / "dev.jsonl", scratch / "train.jsonl"
    for path, trajs in ((dev_file, dev), (train_file, train)):
        with TrajectoryWriter(path, mode="w") as w:
            for t in trajs:
                w.write(t)
    triples = reference_triples(train_file)
    refs = {n: build_reference(n, triples) for n in REFS}
    steps = sample_steps(dev, args.steps, args.seed)

    cache = default_cache_dir()
    wanted = set(args.only if args.only is not None else ([] if args.extra else ROWS))

    def trained(preset: str) -> tuple[Path, dict]:
        given = getattr(args, f"{preset}_sft")
        extra = getattr(args, f"{preset}_sft_args").split()
        path = Path(given) if given else train_sft(preset, cache / f"bench-sft-{preset}", extra)
        return path, read_sft_meta(path)

    plan = []
    if wanted & {ROWS[0], ROWS[1]}:
        tiny_sft, tiny_meta = trained("tiny")
        tiny_base = resolve_model("tiny", cache, training_texts(train))
        ctx = tiny_meta["settings"]["seq_len"]
        plan += [(ROWS[0], tiny_base, ctx, None), (ROWS[1], tiny_sft, ctx, tiny_meta)]
    if wanted & {ROWS[2], ROWS[3]}:
        smol_sft, smol_meta = trained("smollm2")
        ctx = smol_meta["settings"]["seq_len"]
        plan += [(ROWS[2], resolve_model("smollm2", cache), ctx, None),
                 (ROWS[3], smol_sft, ctx, smol_meta)]
    for item in args.extra:
        label, _, folder = item.partition("=")
        meta = read_sft_meta(folder)
        plan.append((label, Path(folder), meta["settings"]["seq_len"], meta))
        wanted.add(label)
    keep = Path(args.keep) if args.keep else None
    results: dict[str, Any] = {}
    for name, path, ctx, meta in plan:
        if name not in wanted:
            continue
        print(f"== {name}: {path} (context {ctx})", flush=True)
        res = evaluate(name, path, ctx, dev, dev_file, steps, refs, args, keep)
        if args.free_running:
            work = Path(tempfile.mkdtemp(prefix="free-", dir=scratch))
            res["free_running"] = free_running(path, args.free_running, train_file, work, ctx,
                                               threads)
            print(f"   free-running: {json.dumps(res['free_running'])[:300]}", flush=True)
        if meta:
            res["sft"] = {k: meta.get(k) for k in ("steps", "tokens_seen", "train_seconds",
                                                   "wall_seconds", "tokens_per_s", "stopped_by",
                                                   "initial_loss", "final_loss", "command")}
            res["sft"]["settings"] = meta.get("settings")
            res["sft"]["data"] = meta.get("data")
        results[name] = res
        print(f"   act parse {res['parsed_call']['rate']:.1%}, exact call "
              f"{res['exact_call']['rate']:.1%}, rehearse exact {res['rehearse_exact']['rate']:.1%}"
              f", json_f1 {res['rehearse_json_f1']['mean']:.3f}", flush=True)

    previous = RESULTS / "presets.json"
    history: list[dict[str, Any]] = []
    if not set(ROWS) <= wanted and previous.is_file():  # keep the rows not measured this time
        old = json.loads(previous.read_text())
        if old.get("sampled") == steps:
            history = old.get("history", [])
            results = {**{k: v for k, v in old.get("models", {}).items() if k not in results},
                       **results}
    text, comparison, ref_rows = report(results)
    out = write_result("presets", {
        "split": "dev (scenario-level held out)",
        "sampled_steps": sum(len(v) for v in steps.values()),
        "sampled_trajectories": len(steps),
        "seed": args.seed,
        "sampled": steps,
        "probe": {"act_max_new_tokens": args.act_tokens,
                  "rehearse_max_new_tokens": args.rehearse_tokens, "decoding": "greedy",
                  "history": "real (teacher-forced)", "prompt": "envace.model.windows.prompt_ids"},
        "references": {"built_from": "train split real trajectories", "on_sampled_steps": ref_rows},
        "models": results,
        "tiny_sft_vs_untrained": comparison,
        "note": "trained vs untrained: paired bootstrap over trajectories of the difference in "
                "means on the same steps; * = the 95% interval excludes 0",
        "table": text,
        "load_average": {"start": load0, "end": os.getloadavg()},
        "probe_threads": threads,
        "seconds": round(time.perf_counter() - t_start, 1),
        "command": shlex.join(["python", "-m", "experiments.presets", *sys.argv[1:]]),
        "history": [*history, {"date": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "command": ["python", "-m", "experiments.presets", *sys.argv[1:]],
                               "rows": [n for n, *_ in plan], "probe_threads": threads,
                               "load_average": {"start": load0, "end": os.getloadavg()}}],
    })
    print("->", out)


if __name__ == "__main__":
    main()
