"""Benchmark: the paper's claims again, at equal steps and several seeds (issue #17).

    .venv/bin/python -m experiments.claims --base "runs/tc-base-s*" \
        --mode "grpo=runs/tc-grpo-s*" --mode "envace=runs/tc-envace-s*" \
        --mode "split=runs/tc-split-s*" --mode "grpo + real-obs loss=runs/tc-grpo-obs-s*" \
        --versus envace:grpo --name claims_tiny_dev

Every run directory is an `envace train` run with its own evaluation in the real environment
(``eval/<split>/trajectories.jsonl``, `experiments.learning.per_task`) and the audit of its
rehearsed evaluation (``eval/<split>_rehearsed/audit``, `experiments.learning.fidelity`). A run's
seed is read from its ``config.yaml``; the evaluated tasks are sampled with the seed, so each run is
compared with the start (``--base``, step 0: ``envace train ... steps=0``) evaluated with the same
seed, task by task.

Per mode: each seed's reward and success and their difference from the start, paired over
tasks, with a bootstrap interval resampling that seed's tasks (`task_ci`: what one seed shows);
across seeds the mean of the seeds' differences with a **t interval over the seed means**
(`across_seeds`, df = seeds − 1; each seed mean already carries its tasks' noise, so nothing is
counted twice), the per-seed differences listed and how many are positive. With two or three
seeds the interval is wide, as it should be: a two-level bootstrap (an earlier version) is never
wider than the range of the seed means, which with three seeds understates the spread; one seed
gives no across-seed interval. ``--versus A:B`` compares two modes seed by seed on the same
tasks the same way (A − B). Rehearsal fidelity on the evaluated split (the share of rehearsed
responses diverging from reality) is reported per seed with its trajectory-bootstrap interval,
and each run's training reward, first against last third of its steps (`train_reward`; across
seeds the same t interval over the seeds' differences): on a fixed pool (``train_tasks=32
eval_split=train``) that says whether the optimizer learns what it trains on, in the conditions
it trains in. The columns name the split the runs were evaluated on (``eval_split`` in each
run's ``config.yaml``: ``dev``, or ``train`` for a pool). Writes
``bench/results/<name>.json`` (machine, load, every figure) and prints the tables.
"""

from __future__ import annotations

import argparse
import glob
import os
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import run_record, table, write_result
from envace.core.layout import RUN
from experiments.learning import boot_diff, eval_split, fidelity, per_task, step_rewards


def exact_paired_ci(worse: int, better: int, tasks: int,
                    level: float = 0.95) -> tuple[float, float]:
    """An interval for a paired difference of success rates, (better − worse) / tasks, from the
    discordant tasks alone: conditional on m = worse + better discordant tasks, `better` is
    Binomial(m, π) and the difference is (m / tasks)(2π − 1), so a Clopper–Pearson interval for
    π gives one for the difference (the interval that goes with McNemar's exact test: it holds
    zero unless that test rejects). With no discordant task, [−u, u] where u is the Wilson upper
    bound of 0 discordant in `tasks` (the difference can be no larger than the discordant share)."""
    from scipy import stats

    from audit.stats.intervals import wilson_ci

    m = worse + better
    if m == 0:
        u = wilson_ci(0, tasks)[1] or 0.0
        return -u, u
    ci = stats.binomtest(better, m).proportion_ci(confidence_level=level, method="exact")
    return m / tasks * (2 * ci.low - 1), m / tasks * (2 * ci.high - 1)


def train_reward(run: Path) -> dict[str, Any]:
    """The run's training reward, first against last third of its steps (the rewards its own
    rollouts earned: the real environment's for `grpo`, its own rehearsals' for `envace`), with
    a bootstrap interval of the difference resampling episodes (`experiments.learning.boot_diff`);
    {} for a run without rollouts."""
    per_step = [x for x in step_rewards(run) if x]
    if not per_step:
        return {}
    k = max(1, len(per_step) // 3)
    first = [r for step in per_step[:k] for r in step]
    last = [r for step in per_step[-k:] for r in step]
    lo, hi = boot_diff(first, last)
    return {"steps": len(per_step), "first_third": float(np.mean(first)),
            "last_third": float(np.mean(last)),
            "diff": float(np.mean(last) - np.mean(first)), "lo": lo, "hi": hi}


def task_ci(diffs: list[float], n_boot: int = 5000, seed: int = 0,
            level: float = 0.95) -> dict[str, Any]:
    """Mean of one seed's per-task differences and a percentile bootstrap interval resampling
    its tasks; None everywhere without tasks.

    Where every difference is −1, 0 or +1 (success, one evaluation sample per task) the
    bootstrap is too narrow: with a handful of discordant tasks all one way it excludes zero
    where McNemar's exact test does not reject. The interval is then widened to contain
    :func:`exact_paired_ci` (``method`` says so) and the discordant counts are reported."""
    d = np.asarray(diffs, dtype=float)
    if not len(d):
        return {"mean": None, "lo": None, "hi": None, "tasks": 0}
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, len(d), (n_boot, len(d)))].mean(axis=1)
    alpha = (1 - level) / 2
    lo, hi = (float(v) for v in np.quantile(boots, [alpha, 1 - alpha]))
    out: dict[str, Any] = {"mean": float(d.mean()), "lo": lo, "hi": hi, "tasks": len(d),
                           "method": "task_bootstrap"}
    if np.isin(d, (-1.0, 0.0, 1.0)).all():
        worse, better = int((d == -1).sum()), int((d == 1).sum())
        elo, ehi = exact_paired_ci(worse, better, len(d), level)
        out.update(lo=min(lo, elo), hi=max(hi, ehi), discordant={"worse": worse,
                                                                 "better": better},
                   method="task_bootstrap widened to the exact paired interval")
    return out


_TIE = 1e-9


def across_seeds(diffs_by_seed: list[list[float]], level: float = 0.95) -> dict[str, Any]:
    """The mean over seeds of each seed's mean difference, with a Student t interval over the
    seed means (df = seeds − 1): seeds are the independent units, and each seed's mean already
    holds its tasks' noise. Lists the seed means and how many are positive; seeds without tasks
    are ignored; bounds are None with fewer than two seeds, and where the seeds' means are all
    equal (a zero-width interval would claim a certainty two or three seeds cannot give;
    ``interval`` then says so)."""
    from scipy import stats

    per_seed = [float(np.mean(d)) for d in diffs_by_seed if len(d)]
    # a seed mean within rounding of zero (0.1 + 0.2 - 0.3 is 5.6e-17) counts as neither sign
    out: dict[str, Any] = {"mean": None, "lo": None, "hi": None, "seeds": len(per_seed),
                           "per_seed": per_seed,
                           "positive_seeds": sum(m > _TIE for m in per_seed),
                           "negative_seeds": sum(m < -_TIE for m in per_seed),
                           "interval": f"t over seed means, df = seeds - 1, {level:.0%}"}
    if not per_seed:
        return out
    out["mean"] = float(np.mean(per_seed))
    if len(per_seed) < 2:
        out["interval"] = "one seed: no interval"
        return out
    sd = float(np.std(per_seed, ddof=1))
    if not sd > 0:
        out["interval"] = f"the {len(per_seed)} seed means are equal: no interval"
        return out
    half = float(stats.t.ppf((1 + level) / 2, len(per_seed) - 1) * sd / np.sqrt(len(per_seed)))
    out["lo"], out["hi"] = out["mean"] - half, out["mean"] + half
    return out


def run_seed(run: Path) -> int:
    import yaml

    return int((yaml.safe_load((run / RUN.config).read_text()) or {}).get("seed", 0))


def finished(run: Path) -> bool:
    """A run that is not going (no ``RUNNING`` marker) and wrote its evaluation."""
    return not (run / RUN.running).exists() and \
        (RUN.eval_dir(run, eval_split(run)) / RUN.eval_trajectories).is_file()


def by_seed(pattern: str) -> dict[int, Path]:
    """Finished run directories matching `pattern`, by their seed (unfinished ones are left out,
    said on stdout); ValueError for none or two of one seed."""
    runs = [Path(p) for p in sorted(glob.glob(pattern)) if (Path(p) / RUN.config).is_file()]
    if not runs:
        raise ValueError(f"no run directory matches {pattern!r}")
    done = [r for r in runs if finished(r)]
    for r in sorted(set(runs) - set(done)):
        print(f"{r}: still running or never evaluated ({RUN.running} present or no "
              "evaluation); left out")
    runs = done
    out: dict[int, Path] = {}
    for r in runs:
        s = run_seed(r)
        if s in out:
            raise ValueError(f"{pattern!r}: two runs of seed {s} ({out[s]}, {r})")
        out[s] = r
    return out


def paired(a: dict[str, tuple[float, float]], b: dict[str, tuple[float, float]],
           index: int) -> list[float]:
    """b − a per task both evaluated (index 0: reward, 1: success)."""
    return [b[t][index] - a[t][index] for t in sorted(set(a) & set(b))]


def _fmt(ci: dict[str, Any]) -> str:
    if ci["mean"] is None:
        return "n/a"
    if ci["lo"] is None:
        return f"{ci['mean']:+.3f} ({ci.get('interval', 'no interval')})"
    return f"{ci['mean']:+.3f} [{ci['lo']:+.3f}, {ci['hi']:+.3f}]"


def _seeds(ci: dict[str, Any]) -> str:
    return " ".join(f"{m:+.3f}" for m in ci["per_seed"]) + \
        f" ({ci['positive_seeds']} up, {ci['negative_seeds']} down of {ci['seeds']})"


def _div(f: dict[str, Any]) -> str:
    if not f or f.get("divergence_rate") is None:
        return "–"
    lo, hi = f.get("divergence_ci") or (float("nan"), float("nan"))
    return f"{f['divergence_rate']:.0%} [{lo:.0%}, {hi:.0%}]"


def _train(tr: dict[str, Any]) -> str:
    if not tr:
        return "–"
    return (f"{tr['first_third']:.3f} → {tr['last_third']:.3f} "
            f"[{tr['lo']:+.3f}, {tr['hi']:+.3f}]")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="glob of the step-0 runs, one per seed")
    ap.add_argument("--mode", action="append", required=True, metavar="LABEL=GLOB",
                    help="a mode's runs, one per seed")
    ap.add_argument("--versus", action="append", default=[], metavar="A:B",
                    help="compare two modes' labels seed by seed (A - B)")
    ap.add_argument("--name", default="claims_tiny_dev")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    try:
        base = by_seed(args.base)
        modes = {}
        for spec in args.mode:
            label, sep, pattern = spec.partition("=")
            if not sep or not label.strip():
                raise ValueError(f"expected LABEL=GLOB, got {spec!r}")
            modes[label.strip()] = by_seed(pattern.strip())
        for v in args.versus:
            a, sep, b = v.partition(":")
            if not sep or a not in modes or b not in modes:
                raise ValueError(f"--versus {v!r}: give A:B with two --mode labels")
    except ValueError as e:
        ap.error(str(e))
    evals = {s: per_task(p) for s, p in base.items()}
    res: dict[str, Any] = {"base": {str(s): str(p) for s, p in base.items()}, "modes": {},
                           "versus": {}}
    rows = []
    for s, p in base.items():
        v = evals[s]
        rows.append(["start (step 0)", s, len(v), f"{np.mean([x[0] for x in v.values()]):.3f}",
                     f"{np.mean([x[1] for x in v.values()]):.1%}", "", _div(fidelity(p)), ""])
    summary_rows = []
    tasks: dict[str, dict[int, dict[str, tuple[float, float]]]] = {}
    for label, runs in modes.items():
        seeds: dict[str, Any] = {}
        diffs: tuple[list[list[float]], list[list[float]]] = ([], [])
        trains: list[list[float]] = []
        tasks[label] = {}
        for s, p in sorted(runs.items()):
            if s not in evals:
                print(f"{label}: seed {s} has no start run; left out")
                continue
            cur = tasks[label][s] = per_task(p)
            dr, ds = paired(evals[s], cur, 0), paired(evals[s], cur, 1)
            diffs[0].append(dr)
            diffs[1].append(ds)
            fid, tr = fidelity(p), train_reward(p)
            if tr:
                trains.append([tr["diff"]])
            seeds[str(s)] = {"run": str(p), "tasks": len(dr), "eval_split": eval_split(p),
                             "reward": float(np.mean([cur[t][0] for t in cur])),
                             "success": float(np.mean([cur[t][1] for t in cur])),
                             "reward_diff": task_ci(dr),
                             "success_diff": task_ci(ds),
                             "eval_fidelity": fid, "train_reward": tr}
            rows.append([label, s, len(dr), f"{seeds[str(s)]['reward']:.3f}",
                         f"{seeds[str(s)]['success']:.1%}",
                         _fmt(seeds[str(s)]["reward_diff"]), _div(fid), _train(tr)])
        rd, sd = across_seeds(diffs[0]), across_seeds(diffs[1])
        td = across_seeds(trains)
        res["modes"][label] = {"seeds": seeds, "reward_diff": rd, "success_diff": sd,
                               "train_reward_diff": td}
        summary_rows.append([label, rd["seeds"], _seeds(rd), _fmt(rd), _fmt(sd), _fmt(td)])
    for v in args.versus:
        a, _, b = v.partition(":")
        common = sorted(set(tasks[a]) & set(tasks[b]))
        rd = across_seeds([paired(tasks[b][s], tasks[a][s], 0) for s in common])
        sd = across_seeds([paired(tasks[b][s], tasks[a][s], 1) for s in common])
        res["versus"][v] = {"seeds": common, "reward_diff": rd, "success_diff": sd,
                            "per_seed_tasks": {
                                str(s): task_ci(paired(tasks[b][s], tasks[a][s], 0))
                                for s in common}}
        summary_rows.append([f"{a} − {b}", len(common), _seeds(rd), _fmt(rd), _fmt(sd), ""])
    on = "/".join(sorted({eval_split(p) for p in base.values()}))
    res["eval_split"] = on
    print(table(rows, ["policy", "seed", "tasks", f"{on} reward", f"{on} success",
                       "reward − start, 95% CI (tasks)", f"rehearsed diverging on {on}",
                       "training reward, first → last third"]))
    print(table(summary_rows, ["comparison", "seeds", "reward difference per seed",
                               "mean, 95% t interval over seeds", "success difference",
                               "training reward, last − first third"]))
    res.update(run_record("experiments.claims", argv, load_start))
    res.update(quiet_machine=None, load_scope="aggregation",
               load_not_recorded="the runs were measured when they trained and evaluated; "
                                 "envace train does not record the load, and this file's "
                                 "load_average is the reading's")
    res["table"] = {"per_seed": rows, "summary": summary_rows}
    print("->", write_result(args.name, res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
