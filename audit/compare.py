"""Two audits side by side (two checkpoints, two simulators), with intervals and p-values.

Both audits are read from their ``steps.jsonl`` and reduced to the steps their statistics count
(``audit.stats.population``: answered rehearsed steps, or the real ones of a determinism check), so
an audit written before the current summary format compares the same way. Steps of one trajectory
are not independent, nor are BFCL's four variants of one scenario, so every difference (divergence
rate, each scorer's mean) gets a cluster-bootstrap interval and a p-value
(``audit.stats.intervals.ratio_difference``) that resample the environment's unit
(``resampling_unit``, ``audit.stats.clusters``; ``cluster_by`` overrides it):

- ``paired_by_trajectory`` when both audits hold the same trajectories (same ids, e.g. two
  simulators or two verdicts over one trajectory file): clusters are resampled together, and a
  rate over the same steps is tested by the exact cluster sign-flip test (``test``);
- ``independent`` otherwise: each audit's clusters are resampled on their own (bootstrap
  p-value, never below 1 / (B + 1)).

``design`` in the output says which. Two likelihood audits (``envace probe --likelihood``) are
compared on the calls both scored: ``likelihood`` holds each side's bits per byte and B − A on
the paired calls with a cluster-bootstrap interval (``audit.stats.likelihood.compare_likelihood``).
When both audits scored the same calls (same task, step,
tool and arguments) the matched calls are also compared directly (``paired``: how many diverged
in one audit only, and the difference on those calls, resampling A's trajectories).

Damaged audits: a line of ``steps.jsonl`` or a field of ``summary.json`` that cannot be used is
listed in ``skipped_records`` (file, line, reason) and left out; an audit with nothing usable
raises :class:`envace.core.errors.UsageError`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from audit.stats.clusters import CLUSTER, assign_clusters, resolve
from audit.stats.compounding import compounding_ratio
from audit.stats.history import split_histories
from audit.stats.intervals import (
    SIGN_FLIP,
    IntervalSpec,
    cluster_codes,
    cluster_sums,
    ratio_difference,
)
from audit.stats.likelihood import compare_likelihood
from audit.stats.population import population
from audit.stats.steps import clean
from audit.store.models import place
from audit.store.records import read_steps, read_summary
from envace.core.errors import UsageError
from envace.core.layout import AUDIT
from envace.core.outfile import input_problem

PAIRED = "paired_by_trajectory"
INDEPENDENT = "independent"


def _load(dir_: Path, skipped: list[dict[str, Any]]) -> tuple[dict, list[dict]]:
    """An audit's usable summary fields and step records; what is not usable goes to
    ``skipped`` (file, line, reason). Raises UsageError when nothing in it is usable."""
    why = input_problem(dir_ / AUDIT.steps)
    if why:
        raise UsageError(f"{dir_} is not an audit directory ({why})")
    try:
        steps = read_steps(dir_)
    except OSError as exc:
        raise UsageError(f"cannot read {dir_ / AUDIT.steps}: {exc.strerror or exc}") from None
    if steps.unusable:
        first = steps.skipped[0]
        raise UsageError(f"no usable step record ({steps.nonblank} lines; "
                         f"{place(first)}: {first['reason']})")
    summary, problems = read_summary(dir_)
    skipped.extend(problems + steps.skipped)
    return summary, steps.records


def _scored(rows: list[dict]) -> list[str]:
    """Scorer names every row carries (an audit whose summary.json lost its list)."""
    names = [set(r.get("scores") or {}) for r in rows]
    return sorted(set.intersection(*names)) if names else []


def _key(s: dict) -> str:
    return json.dumps([s["task_id"], s["step"], s["tool"], s.get("arguments")], sort_keys=True,
                      default=repr)


def _columns(rows: list[dict], scorers: list[str]) -> np.ndarray:
    """Per step: diverged (0/1), then each scorer (NaN when not scored)."""
    def score(r: dict, name: str) -> float:
        v = (r.get("scores") or {}).get(name)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else np.nan

    return np.array([[float(bool(r["diverged"]))] + [score(r, n) for n in scorers]
                     for r in rows], dtype=float).reshape(len(rows), 1 + len(scorers))


def _per_trajectory(rows: list[dict], scorers: list[str], ids: list[str]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(sums, counts) per cluster (``audit.stats.clusters``), rows of the result in the order of
    ``ids``."""
    index = {t: i for i, t in enumerate(ids)}
    codes = np.array([index[str(r[CLUSTER])] for r in rows], dtype=np.int64)
    return cluster_sums(codes, _columns(rows, scorers), len(ids))


def compare_audits(dir_a: str | Path, dir_b: str | Path, alpha: float = 0.05,
                   spec: IntervalSpec | None = None, cluster_by: str | None = None
                   ) -> dict[str, Any]:
    """Compare two audit directories (B − A); see the module docstring for the design.
    ``cluster_by``: the resampling unit (None: the one the rows' environment declares)."""
    skipped: list[dict[str, Any]] = []
    sa, all_a = _load(Path(dir_a), skipped)
    sb, all_b = _load(Path(dir_b), skipped)
    chosen = resolve([*all_a, *all_b], cluster_by)
    unit = chosen.unit
    assign_clusters(all_a, unit, chosen.cluster_of)
    assign_clusters(all_b, unit, chosen.cluster_of)
    spec = spec or IntervalSpec(resamples=2000, seed=0, level=1 - alpha)
    spec = IntervalSpec(spec.resamples, spec.seed, spec.level, unit)
    all_a, _, ha = split_histories(all_a, IntervalSpec(0))
    all_b, _, hb = split_histories(all_b, IntervalSpec(0))
    pa, pb = population(all_a), population(all_b)
    a, b = pa.rows, pb.rows
    scorers = sorted(set(sa.get("scorers") or _scored(a)) & set(sb.get("scorers") or _scored(b)))
    ids_a = sorted({str(r["trajectory_id"]) for r in a})
    ids_b = sorted({str(r["trajectory_id"]) for r in b})
    paired = bool(ids_a) and ids_a == ids_b
    cl_a = sorted({str(r[CLUSTER]) for r in a})
    cl_b = sorted({str(r[CLUSTER]) for r in b})
    if paired:  # the same trajectories: one list of clusters indexes both sides
        cl_a = cl_b = sorted(set(cl_a) | set(cl_b))
    ta, tb = _per_trajectory(a, scorers, cl_a), _per_trajectory(b, scorers, cl_b)
    diffs = (ratio_difference(ta, tb, spec, paired) if ids_a and ids_b
             else _points_only(ta, tb, 1 + len(scorers)))
    out: dict[str, Any] = {
        "a": str(dir_a), "b": str(dir_b), "alpha": alpha,
        "design": PAIRED if paired else INDEPENDENT,
        "interval": spec.describe(),
        "population": {"a": pa.kind, "b": pb.kind},
        "steps": {"a": len(a), "b": len(b)},
        "trajectories": {"a": len(ids_a), "b": len(ids_b)},
        "resampling_unit": unit,
        "clusters": {"a": len({r[CLUSTER] for r in a}), "b": len({r[CLUSTER] for r in b})},
        "divergence_rate": diffs[0],
        "scores": dict(zip(scorers, diffs[1:], strict=True)),
        "compounding_ratio": {"a": compounding_ratio(a, n_boot=0)["ratio"],
                              "b": compounding_ratio(b, n_boot=0)["ratio"]},
        "skipped_records": skipped,
    }
    if ha is not None or hb is not None:  # probes with both histories: each side's split
        out["history"] = {side: None if h is None else {
            k: (h.get("overall") or {}).get(k, {}).get("point") for k in ("real", "own")}
            | {"own_minus_real": (h.get("overall") or {}).get("diff", {}).get("diff"),
               "compounding_share_deep": h["deep"]["compounding_share"]["point"]}
            for side, h in (("a", sa.get("history") or ha), ("b", sb.get("history") or hb))}
    lk = compare_likelihood(all_a, all_b, spec)
    if lk is not None:  # two likelihood audits: bits per byte on the same calls, paired
        out["likelihood"] = lk
    index_b = {_key(s): s for s in b}
    pairs = [(s, index_b[_key(s)]) for s in a if _key(s) in index_b]
    if pairs:
        out["paired"] = _matched_calls(pairs, spec)
    for block in [out["divergence_rate"], out.get("paired", {}), out.get("likelihood", {}),
                  *out["scores"].values()]:
        if block.get("p_value") is not None:
            block["significant"] = block["p_value"] < alpha
    return clean(out)


def _points_only(ta: tuple[np.ndarray, np.ndarray], tb: tuple[np.ndarray, np.ndarray],
                 columns: int) -> list[dict[str, Any]]:
    """An audit without a counted step: each side's figure where it has one, no difference."""
    def point(t: tuple[np.ndarray, np.ndarray], j: int) -> float | None:
        sums, counts = (np.asarray(x, dtype=float).reshape(-1, columns) for x in t)
        n = counts[:, j].sum() if len(counts) else 0.0
        return float(sums[:, j].sum() / n) if n > 0 else None

    return [{"a": point(ta, j), "b": point(tb, j), "diff": None, "ci": None, "p_value": None,
             "method": None} for j in range(columns)]


def _matched_calls(pairs: list[tuple[dict, dict]], spec: IntervalSpec) -> dict[str, Any]:
    """Divergence on the calls both audits scored, resampling A's clusters (pairs kept).

    ``p_value`` is the exact cluster sign-flip test of the discordant calls
    (``audit.stats.intervals.sign_flip_p``): each cluster's (only B − only A) keeps or flips its
    sign with probability 1/2 under H0, enumerated exactly. It is a permutation test, exact at any
    size, that needs no variance estimate (Obuchowski's clustered McNemar is a large-sample normal
    approximation, poor with 30 clusters); with one call per cluster it *is* the exact McNemar test.
    ``mcnemar_exact_p`` is the plain exact McNemar test (binomial on the discordant calls), which
    treats the calls as independent: valid only with one call per cluster, given beside it to show
    what clustering changes."""
    from scipy.stats import binomtest

    va = np.array([float(bool(x["diverged"])) for x, _ in pairs])
    vb = np.array([float(bool(y["diverged"])) for _, y in pairs])
    codes, ids = cluster_codes([x[CLUSTER] for x, _ in pairs])
    d = ratio_difference(cluster_sums(codes, va, len(ids)), cluster_sums(codes, vb, len(ids)),
                         spec, paired=True)[0]
    only_a = int(((va == 1) & (vb == 0)).sum())
    only_b = int(((vb == 1) & (va == 0)).sum())
    plain = (float(binomtest(only_b, only_a + only_b, 0.5).pvalue) if only_a + only_b else 1.0)
    return {"pairs": len(pairs), "trajectories": len({str(x["trajectory_id"]) for x, _ in pairs}),
            "clusters": len(ids), "only_a_diverged": only_a, "only_b_diverged": only_b,
            "diff": d["diff"], "ci": d["ci"], "p_value": d["p_value"], "test": d["test"],
            "method": d["method"], "mc_error": d["mc_error"], "mcnemar_exact_p": plain}


def render_compare(c: dict[str, Any]) -> str:
    """``compare.md``: the comparison as a Markdown table."""
    def f(x: Any) -> str:
        return "–" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))

    def ci(v: dict) -> str:
        return "–" if not v.get("ci") else f"[{f(v['ci'][0])}, {f(v['ci'][1])}]"

    def fp(v: dict) -> str:  # a p-value to 3 significant digits (an exact one may be tiny)
        x = v.get("p_value")
        return "–" if x is None else f"{x:.3g}" + (" (exact)" if v.get("test") == SIGN_FLIP
                                                    else "")

    dr = c["divergence_rate"]
    unit = c.get("resampling_unit", "trajectory")
    design = (f"paired by trajectory (both audits hold the same trajectories; their {unit} "
              "clusters resampled together)" if c["design"] == PAIRED else
              f"independent (each audit's {unit} clusters resampled on their own)")
    err = max((v.get("mc_error") or 0.0 for v in [dr, *c["scores"].values()]), default=0.0)
    lines = [f"# Audit comparison\n\nA = {c['a']}  \nB = {c['b']}\n",
             f"Rehearsed steps only (A: {c['steps']['a']} in {c['trajectories']['a']} "
             f"trajectories, B: {c['steps']['b']} in {c['trajectories']['b']}). Intervals: "
             f"cluster bootstrap resampling the {unit} ({c['interval']['resamples']} "
             f"resamples, seed {c['interval']['seed']}; Monte-Carlo error of the interval "
             f"ends up to {err:.3f}); design: {design}. p: the exact cluster sign-flip test "
             "(exact) where both sides count the same steps (a rate on the same calls; the "
             "exact McNemar test when every cluster is one call), else the bootstrap's "
             f"(never below 1/{c['interval']['resamples'] + 1}).\n",
             "| figure | A | B | B − A | interval | p | significant |",
             "|---|---|---|---|---|---|---|",
             f"| divergence rate | {f(dr['a'])} | {f(dr['b'])} | {f(dr['diff'])} | {ci(dr)} | "
             f"{fp(dr)} | {dr.get('significant', '–')} |"]
    for name, v in c["scores"].items():
        lines.append(f"| mean {name} | {f(v['a'])} | {f(v['b'])} | {f(v['diff'])} | {ci(v)} | "
                     f"{fp(v)} | {v.get('significant', '–')} |")
    cr = c["compounding_ratio"]
    lines.append(f"| compounding ratio | {f(cr['a'])} | {f(cr['b'])} | | | | |")
    for key, label in (("real", "divergence, real history"), ("own", "divergence, own history"),
                       ("own_minus_real", "own − real"),
                       ("compounding_share_deep", "compounding share, depth ≥ 3")):
        if "history" in c:
            ha, hb = c["history"]["a"] or {}, c["history"]["b"] or {}
            lines.append(f"| {label} | {f(ha.get(key))} | {f(hb.get(key))} | | | | |")
    for side in ("a", "b"):
        if c["population"][side] == "determinism_check":
            lines.append(f"\n{side.upper()} holds real responses only: its figures are a "
                         "determinism check, not fidelity.")
    if "paired" in c:
        p = c["paired"]
        lines += ["", f"Matched on {p['pairs']} identical calls in {p['trajectories']} "
                      f"trajectories ({p.get('clusters', '?')} clusters): only A diverged "
                      f"{p['only_a_diverged']}, only B {p['only_b_diverged']}; B − A "
                      f"{f(p['diff'])} {ci(p)}, exact cluster sign-flip p = {fp(p)} "
                      f"({'significant' if p.get('significant') else 'n.s.'}; the plain exact "
                      f"McNemar test, calls as independent: p = "
                      f"{fp({'p_value': p.get('mcnemar_exact_p')})})."]
    if c.get("likelihood"):
        lk = c["likelihood"]
        lines.append(f"| bits per byte (likelihood) | {f(lk.get('a'))} | {f(lk.get('b'))} | "
                     f"{f(lk.get('diff'))} | {ci(lk)} | {fp(lk)} | |")
        lines += ["", f"Bits per byte: B − A on the {lk['pairs']} calls both likelihood audits "
                      "scored, paired (clusters resampled together)."
                  + (f" {lk['note']}." if lk.get("note") else "")]
    if c.get("skipped_records"):
        lines += ["", f"Not used ({len(c['skipped_records'])}):", ""]
        lines += [f"- {place(r)}: {r['reason']}" for r in c["skipped_records"][:20]]
    return "\n".join(lines) + "\n"
