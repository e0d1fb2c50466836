"""Fixture runs for the dashboard tests, made with the project's own commands where they exist.

    .venv/bin/python tests/fixtures_dashboard.py OUT_DIR [--tasks 12]

Builds, under OUT_DIR:

- ``inputs/dev.jsonl``, ``inputs/train.jsonl`` — ``envace data export-real`` (real trajectories
  of N dev tasks, and of a quarter of the train split as the reference world models' data);
- ``real_dev/`` — ``envace-audit replay inputs/dev.jsonl --reference inputs/train.jsonl``
  (a plain audit directory: real responses, never diverges);
- ``lookup_dev/`` — ``envace-audit baseline ... --model lookup`` (a reference world model
  audited as if it were the rehearser: realistic divergence);
- ``tiny/`` — a **real** finished training run: ``envace train --config configs/tiny.yaml`` (the
  demo's preset) cut to ``TINY_ARGS`` (3 steps of 2 × 2 episodes, 3 dev tasks: well under a
  minute), with everything the trainer writes: ``metrics.jsonl``, ``rollouts/``, an audit per
  step, checkpoints, ``eval/dev`` and ``eval/dev_rehearsed`` with its audit, ``report.md``.
  The dashboard tests open this run wherever a real run has what they check;
- ``demo/`` — a *synthetic* finished training run, kept only for cases no short real run
  produces: ``rollouts/step_{0,5,10}.jsonl`` (the dev trajectories
  rewritten as rehearsals: some responses replaced by the lookup model's guesses, fewer at later
  steps, and in some trajectories a call skipped or repeated), each audited by
  ``envace-audit replay`` into ``audit/step_<N>/``; ``eval/rehearsal_dev/`` (test-time rehearsal
  in ``envace eval --rehearsal``'s layout: plans, memory, commits, summary, the plans' audit);
  ``config.yaml``; ``report.md``; and ``metrics.jsonl``;
- ``eval-dev-parallel-n2/`` — the same evaluation standing alone, as ``envace eval`` leaves it;
- ``live/`` — a run still writing: ``RUNNING``, a truncated last metrics line, no audit yet;
- ``died/`` — a run whose metrics stopped long ago, no report; ``empty/`` — an empty directory.

Everything but ``tiny/``, ``inputs/``, ``real_dev/`` and ``lookup_dev/`` is SYNTHETIC, and each is
kept for a case the real run does not give: ``demo``'s rollouts have a call skipped and one
repeated against the real trajectory (the Trajectories page's alignment), every step rewrites
the same dev trajectories (so two steps' audits pair call by call on the Compare page, and
some tasks never diverge, which the filters need: the real run samples new tasks each step and
diverges nearly everywhere), its step audits were
made with ``--reference`` (the skill tables: the trainer audits without one), ``KL`` and clip
fractions by role are logged (``kl_coef`` is 0 in the tiny preset), and its test-time rehearsal
evaluation succeeds on two tasks of three (the Rehearsal page's success and failure branches: the
tiny model's own ``envace eval --rehearsal`` succeeds on none); ``live``, ``died`` and ``empty``
are states a finished run is not in. Their ``metrics.jsonl`` is written by this script in the
documented flat format (the ``fidelity/*`` values of ``demo`` are the real audit figures of its
step; loss, reward, KL, ... are made up), the rollouts and rehearsal plans are edited real
trajectories rather than a policy's, and the eval summary's success figures are made up (its
layout follows ``envace/evaluation/rehearsal_eval.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STEPS = (0, 5, 10)
P_GUESS = {0: 0.75, 5: 0.45, 10: 0.2}  # share of responses replaced by the lookup model's guess


def _cmd(name: str, module: str) -> list[str]:
    exe = Path(sys.executable).parent / name
    return [str(exe)] if exe.exists() else [sys.executable, "-m", module]


ENVACE = _cmd("envace", "envace.cli")
AUDIT = [*_cmd("envace-audit", "audit.cli"), "--quiet"]


# One BLAS thread per command: the audit's many tiny logistic fits run ~6x slower on a busy
# 2-core machine when OpenBLAS spreads each over threads.
_ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _run(args: list[str], cwd: Path) -> None:
    r = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=_ENV)
    if r.returncode not in (0, 3):
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr[-2000:]}")


def _run_all(jobs: list[tuple[list[str], Path]], workers: int = 2) -> None:
    """Independent commands, two at a time."""
    with ThreadPoolExecutor(workers) as pool:
        for f in [pool.submit(_run, args, cwd) for args, cwd in jobs]:
            f.result()


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def dev_tasks(n: int) -> list[str]:
    ids = (ROOT / "data" / "splits" / "dev.txt").read_text().split()
    step = max(1, len(ids) // n)
    return ids[::step][:n]


def _rehearsal(traj: dict, guesses: dict[int, str], step: int, i: int) -> dict:
    """A real trajectory rewritten as the policy's rehearsal at training step ``step``."""
    rng = random.Random(step * 1000 + i)
    t = json.loads(json.dumps(traj))
    k = 0
    for m in t["messages"]:
        if m["role"] == "tool":
            if k in guesses and rng.random() < P_GUESS[step]:
                m["content"] = guesses[k]
            m["rehearsed"] = True
            k += 1
    calls = [j for j, m in enumerate(t["messages"]) if m.get("tool_calls")]
    msgs = t["messages"]
    if i % 4 == 1 and len(calls) >= 2:  # skip the second call and its response
        j = calls[1]
        del msgs[j:j + 2]
    elif i % 4 == 2 and calls:  # repeat the first call
        j = calls[0]
        dup = json.loads(json.dumps(msgs[j:j + 2]))
        dup[0]["tool_calls"][0]["id"] += "r"
        dup[1]["tool_call_id"] += "r"
        msgs[j + 2:j + 2] = dup
    t.update(id=f"s{step}-{traj['id']}", source="rehearsal",
             reward=float(rng.random() < 0.3 + step / 20), model="fixture-policy",
             meta={"train_step": step, "group": i // 2, "mode": "envace"})
    return t


def _metrics(audits: dict[int, dict], n_steps: int = 11) -> list[dict[str, Any]]:
    rows = []
    for s in range(n_steps):
        x = s / max(1, n_steps - 1)
        row: dict[str, Any] = {
            "step": s, "time": 30.0 * s + 5.0, "loss": 0.9 - 0.5 * x + 0.03 * math.sin(s),
            "reward/mean": 0.3 + 0.4 * x, "reward/act": 0.3 + 0.45 * x,
            "reward/rehearse": 0.25 + 0.35 * x, "adv/act_mean": 0.0, "adv/rehearse_mean": 0.0,
            "clip_frac/act": 0.05 + 0.02 * math.cos(s), "clip_frac/rehearse": 0.04,
            "kl": 0.002 * s, "entropy": 1.4 - 0.3 * x, "tokens/act": 900 + 10 * s,
            "tokens/rehearse": 1400 - 20 * s, "tokens_per_s": 250.0 + s,
            **_times(s, checkpoint=s in STEPS),
        }
        if s in audits:
            summ = audits[s]
            row["fidelity/divergence_rate"] = summ["divergence_rate"]
            for name in ("exact", "json_f1"):
                row[f"fidelity/{name}"] = summ["scores"][name]["mean"]
            for d in summ["by_depth"][:4]:
                row[f"fidelity/depth_{d['depth']}"] = d["divergence_rate"]
        rows.append(row)
    return rows


def _times(step: int, checkpoint: bool) -> dict[str, float]:
    """Made-up ``time/*`` sections of a step (the trainer's keys, envace.core.timing) that add up to
    its ``time/step``, as the trainer's do."""
    from envace.core.timing import STEP_SECTIONS, StepTimer

    clock = iter(range(10_000)).__next__
    timer = StepTimer(clock=lambda: float(clock()))  # one "second" per clock reading
    for name in STEP_SECTIONS:
        if name in ("weight_sync", "eval") or (name == "checkpoint" and not checkpoint):
            continue
        with timer.section(name):
            for _ in range((step + len(name)) % 3):
                clock()
    timer.stop()
    return timer.metrics()


# The real run: the tiny preset, cut short (the whole fixture is made once per test session).
TINY_ARGS = ["--config", "configs/tiny.yaml", "steps=3", "prompts_per_step=2", "group_size=2",
             "max_new_tokens=32", "max_turns=2", "eval_tasks=3", "checkpoint_every=2", "--quiet"]


CONFIG = """# resolved configuration (fixture: synthetic until the trainer exists)
mode: envace
preset: tiny
group_size: 4
learning_rate: 1.0e-05
steps: 10
audit_every: 5
seed: 0
"""


MEMORY_HEADER = ("Rehearsal memory (private plans imagined before acting; their responses may "
                 "be wrong):")


def _plan_line(t: dict, k: int) -> str:
    parts = []
    for m in t["messages"]:
        for c in m.get("tool_calls") or []:
            parts.append(f"{c['function']['name']}({json.dumps(c['function']['arguments'])})")
    return f"Plan {k + 1}: " + "; ".join(parts)


def _eval_dir(d: Path, dev: list[dict], rollouts: dict[int, list[dict]]) -> list[dict]:
    """Test-time rehearsal results in ``envace eval --rehearsal parallel --n 2``'s layout
    (``envace/evaluation/rehearsal_eval.py``): trajectories.jsonl (plans and commits), plans.jsonl;
    summary.json is written by :func:`_eval_summary` once the plans are audited."""
    records, plans_only = [], []
    for i, real in enumerate(dev[:3]):
        task = real["task_id"]
        ids, lines = [], []
        for k, src in enumerate([rollouts[STEPS[0]][i], rollouts[STEPS[-1]][i]]):
            plan = {**src, "id": f"{task}-s0-plan{k}",
                    "meta": {"plan": f"rehearsal_{k}", "seed": 0, "strategy": "parallel",
                             "critique": None}}
            records.append(plan)
            plans_only.append(plan)
            ids.append(plan["id"])
            lines.append(_plan_line(plan, k))
        ok = i != 1
        records.append({**real, "id": f"{task}-s0-commit", "reward": float(ok),
                        "meta": {"plan": "commit", "seed": 0, "strategy": "parallel", "n": 2,
                                 "memory": "\n".join([MEMORY_HEADER, *lines]),
                                 "memory_dropped": 0, "success": ok, "plans": ids,
                                 "budget": {"rehearsal_tokens": 800.0 + 10 * i,
                                            "real_env_calls": 5.0, "commit_tokens": 120.0,
                                            "wall_s_share": 2.5, "rehearsal_wall_s_share": 1.5}}})
    _write(d / "trajectories.jsonl", records)
    _write(d / "plans.jsonl", plans_only)
    return records


def _eval_summary(d: Path, records: list[dict]) -> None:
    from audit.stats.intervals import wilson_ci

    audit = json.loads((d / "audit" / "summary.json").read_text())
    commits = [r for r in records if r["meta"]["plan"] == "commit"]
    k, n = sum(r["meta"]["success"] for r in commits), len(commits)
    summary = {
        "strategy": "parallel", "n": 2, "tasks": n, "seeds": 1, "attempts": n, "successes": k,
        "success_rate": k / n, "success_ci": list(wilson_ci(k, n)), "pass_at_k": {"1": k / n},
        "budget": {"rehearsal_tokens": 810.0, "real_env_calls": 5.0, "commit_tokens": 120.0},
        "rehearsal_audit": {"divergence_rate": audit["divergence_rate"],  # as rehearsal_eval
                            "divergence_ci": audit["divergence_ci"],
                            "steps": audit["counts"]["scored_steps"],
                            "trajectories": audit["counts"]["scored_trajectories"],
                            "dir": str(d / "audit")},
        "fidelity_vs_success": {"tasks_with_rehearsed_steps": n,
                                "note": "too few tasks, or no variation in fidelity or success"},
        "settings": {"strategy": "parallel", "n": 2},
        "fixture": "synthetic until a real `envace eval --rehearsal` run replaces it",
    }
    (d / "summary.json").write_text(json.dumps(summary, indent=1))


def _small_runs(out: Path) -> None:
    live = out / "live"
    live.mkdir(parents=True, exist_ok=True)
    (live / "config.yaml").write_text(CONFIG.replace("steps: 10", "steps: 100"))
    (live / "RUNNING").write_text(str(os.getpid()))
    lines = [json.dumps(r) for r in _metrics({}, 4)]
    (live / "metrics.jsonl").write_text("\n".join(lines) + "\n" + lines[-1][:25])
    died = out / "died"
    died.mkdir(parents=True, exist_ok=True)
    (died / "config.yaml").write_text(CONFIG)
    _write(died / "metrics.jsonl", _metrics({}, 2))
    old = time.time() - 3 * 3600
    os.utime(died / "metrics.jsonl", (old, old))
    (out / "empty").mkdir(parents=True, exist_ok=True)


def build(out: str | os.PathLike[str], n_tasks: int = 12) -> Path:
    """Build every fixture run under ``out`` (see the module docstring); returns ``out``."""
    out = Path(out).resolve()
    (out / "inputs").mkdir(parents=True, exist_ok=True)
    train = (ROOT / "data" / "splits" / "train.txt").read_text().split()[::4]  # a quarter: fast
    with ThreadPoolExecutor(1) as trainer:  # the real run beside the other commands
        real = trainer.submit(_run, [*ENVACE, "train", *TINY_ARGS, f"output_dir={out}",
                                     "run_name=tiny"], ROOT)
        _build_synthetic(out, train, n_tasks)
        real.result()
    return out


def _build_synthetic(out: Path, train: list[str], n_tasks: int) -> None:
    _run_all([([*ENVACE, "data", "export-real", "--tasks", *dev_tasks(n_tasks), "--out",
                "inputs/dev.jsonl"], out),
              ([*ENVACE, "data", "export-real", "--tasks", *train, "--out",
                "inputs/train.jsonl"], out)])
    ref = ["--reference", "inputs/train.jsonl"]
    _run_all([([*AUDIT, "replay", "inputs/dev.jsonl", "--out", "real_dev", *ref], out),
              ([*AUDIT, "baseline", "inputs/dev.jsonl", *ref, "--model", "lookup", "--out",
                "lookup_dev"], out)])
    dev = _read(out / "inputs" / "dev.jsonl")
    guesses: dict[str, dict[int, str]] = {}
    for s in _read(out / "lookup_dev" / "steps.jsonl"):
        guesses.setdefault(s["trajectory_id"], {})[s["step"]] = s["rehearsed"]
    run = out / "demo"
    run.mkdir(exist_ok=True)
    (run / "config.yaml").write_text(CONFIG)
    rollouts = {}
    jobs = []
    for step in STEPS:
        rollouts[step] = [_rehearsal(t, guesses.get(t["id"], {}), step, i)
                          for i, t in enumerate(dev)]
        _write(run / "rollouts" / f"step_{step}.jsonl", rollouts[step])
        jobs.append(([*AUDIT, "replay", f"rollouts/step_{step}.jsonl", "--out",
                      f"audit/step_{step}", "--reference", "../inputs/train.jsonl"], run))
    ev = run / "eval" / "rehearsal_dev"
    ev_records = _eval_dir(ev, dev, rollouts)
    jobs.append(([*AUDIT, "replay", "plans.jsonl", "--out", "audit"], ev))
    _run_all(jobs)
    _eval_summary(ev, ev_records)
    shutil.copytree(ev, out / "eval-dev-parallel-n2")  # envace eval's default --out, standalone
    audits = {step: json.loads((run / "audit" / f"step_{step}" / "summary.json").read_text())
              for step in STEPS}
    _write(run / "metrics.jsonl", _metrics(audits))
    (run / "checkpoints" / f"step_{STEPS[-1]}").mkdir(parents=True, exist_ok=True)
    (run / "report.md").write_text("# demo (fixture run)\n\nSynthetic metrics; real audits.\n")
    _small_runs(out)


def shared_root(base: Path) -> Path:
    """Build the fixture runs once per test session under ``base`` (pytest's basetemp)."""
    out = base / "dashboard-runs"
    done = out / ".built"
    if not done.exists():
        build(out)
        done.write_text("ok")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tasks", type=int, default=12)
    a = ap.parse_args()
    t0 = time.time()
    print(f"fixture runs in {build(a.out, a.tasks)} ({time.time() - t0:.1f} s)")
