"""Compounding: does one wrong rehearsal make the next ones worse?

- :func:`compounding_ratio`: P(diverge | earlier divergence) / P(diverge | none earlier), pooled
  over depths, its interval a cluster bootstrap.
- :func:`logistic_divergence`: divergence on depth, prior divergence, write flag, novelty.
- :func:`compounding_block`: the summary's ``compounding`` block: the ratio, the depth trend
  beside it (``audit.stats.trend``) and which question each answers (:data:`QUESTIONS`).

Pure functions over step records (``audit.stats.steps``); intervals resample whole clusters.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from audit.stats.intervals import cluster_codes, mc_error
from audit.stats.steps import (
    Step,
    by_trajectory,
    clean,
    cluster_of,
    depth_of,
    is_finite,
    scored_steps,
)
from audit.stats.trend import depth_trend


def _ratio(a: float, b: float, c: float, d: float) -> tuple[float | None, str | None]:
    """Risk ratio (a/(a+b)) / (c/(c+d)) or None with the reason."""
    if a + b == 0:
        return None, "no step follows an earlier divergence"
    if c + d == 0:
        return None, "no step at depth >= 1 lacks an earlier divergence"
    if c == 0:
        return None, "no divergence without an earlier one: the ratio is unbounded"
    return (a / (a + b)) / (c / (c + d)), None


def compounding_ratio(
    steps: Iterable[Step],
    ci_method: str = "bootstrap",
    n_boot: int = 1000,
    seed: int = 0,
    z: float = 1.96,
) -> dict:
    """P(diverge at t | an earlier divergence in the trajectory) / P(diverge at t | none earlier).

    Pooled over depths t ≥ 1. ``table`` holds the 2×2 counts. CI: ``"bootstrap"`` resamples
    whole trajectories (steps of one trajectory are not independent; seeded, percentile
    interval; an unbounded upper end is None) or ``"delta"`` (log risk ratio, treats steps as
    independent). ``ratio`` is None, with ``note`` saying why, when a cell makes it undefined.
    A ratio above 1 may be compounding or simply some trajectories being harder than others.
    """
    if ci_method not in ("bootstrap", "delta"):
        raise ValueError("ci_method must be 'bootstrap' or 'delta'")
    trajs = by_trajectory(scored_steps(steps))
    counts = np.zeros((len(trajs), 4), dtype=np.int64)  # a, b, c, d
    per_depth: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for i, group in enumerate(trajs.values()):
        prior = False
        for s in group:
            t = depth_of(s)
            if t >= 1:
                cell = (0 if s["diverged"] else 1) + (0 if prior else 2)
                counts[i, cell] += 1
                per_depth[t][cell] += 1
            prior = prior or bool(s["diverged"])
    a, b, c, d = (int(x) for x in counts.sum(axis=0))
    ratio, note = _ratio(a, b, c, d)
    ci, err = None, None
    if ratio is not None and ci_method == "delta":
        if a > 0:
            se = math.sqrt(1 / a - 1 / (a + b) + 1 / c - 1 / (c + d))
            ci = [ratio * math.exp(-z * se), ratio * math.exp(z * se)]
        else:
            note = "no divergence after an earlier one: ratio 0, delta-method CI undefined"
    elif ratio is not None and n_boot > 0:
        # resample the clusters (the trajectories of one cluster drawn together)
        codes, _ = cluster_codes([cluster_of(g[0]) for g in trajs.values()])
        by_cluster = np.zeros((int(codes.max()) + 1, 4), dtype=np.int64)
        np.add.at(by_cluster, codes, counts)
        ci, boot_note, err = _bootstrap_ratio(by_cluster, n_boot, seed)
        note = boot_note
    rows = [
        {
            "depth": t,
            "prior_n": v[0] + v[1],
            "prior_diverged": v[0],
            "no_prior_n": v[2] + v[3],
            "no_prior_diverged": v[2],
            "p_after_divergence": v[0] / (v[0] + v[1]) if v[0] + v[1] else None,
            "p_no_prior_divergence": v[2] / (v[2] + v[3]) if v[2] + v[3] else None,
        }
        for t, v in sorted(per_depth.items())
    ]
    return clean(
        {
            "ratio": ratio,
            "ci": ci,
            "ci_method": ci_method,
            "ci_mc_error": err,
            "p_after_divergence": a / (a + b) if a + b else None,
            "p_no_prior_divergence": c / (c + d) if c + d else None,
            "table": {
                "prior_diverged": a,
                "prior_matched": b,
                "no_prior_diverged": c,
                "no_prior_matched": d,
            },
            "n_steps": a + b + c + d,
            "n_trajectories": len(trajs),
            "by_depth": rows,
            "note": note,
        }
    )


def _bootstrap_ratio(counts: np.ndarray, n_boot: int, seed: int
                     ) -> tuple[list | None, str | None, float | None]:
    rng = np.random.default_rng(seed)
    n = len(counts)
    batch = max(1, 2_000_000 // max(n, 1))
    ratios = []
    for start in range(0, n_boot, batch):
        idx = rng.integers(0, n, size=(min(batch, n_boot - start), n))
        sums = counts[idx].sum(axis=1).astype(float)
        a, b, c, d = sums.T
        with np.errstate(divide="ignore", invalid="ignore"):
            r = (a / (a + b)) / (c / (c + d))
        ok = (a + b > 0) & (c + d > 0) & ~((a == 0) & (c == 0))
        ratios.append(np.where(ok, r, np.nan))
    r = np.concatenate(ratios)
    r = r[~np.isnan(r)]
    dropped = n_boot - len(r)
    note = f"{dropped} of {n_boot} bootstrap replicates undefined, dropped" if dropped else None
    if len(r) == 0:
        return None, "every bootstrap replicate undefined", None
    lo, hi = np.quantile(r, [0.025, 0.975], method="inverted_cdf")
    err = mc_error(r, 0.95) if np.isfinite(r).all() else None
    return [float(lo), float(hi) if np.isfinite(hi) else None], note, err


def _design(steps: list[Step]) -> tuple[np.ndarray, np.ndarray, list[str], list[str], np.ndarray]:
    """Feature matrix, labels, feature names, notes, cluster index per row (the resampling
    unit's cluster of its trajectory)."""
    rows, notes, groups = [], [], []
    trajs = by_trajectory(steps)
    cluster_index, _ = cluster_codes([cluster_of(g[0]) for g in trajs.values()])
    for gi, group in zip(cluster_index.tolist(), trajs.values(), strict=True):
        prior = 0
        for s in group:
            rows.append(
                (
                    depth_of(s),
                    prior,
                    s.get("mutates_state"),
                    s.get("novelty"),
                    int(bool(s["diverged"])),
                )
            )
            groups.append(gi)
            prior = max(prior, int(bool(s["diverged"])))
    names = ["depth", "prior_divergence", "mutates_state", "novelty"]
    cols = [[r[0] for r in rows], [r[1] for r in rows]]
    keep = names[:2]
    writes = [r[2] for r in rows]
    if all(isinstance(w, (bool, np.bool_)) for w in writes):
        cols.append([int(w) for w in writes])
        keep.append("mutates_state")
    else:
        unknown = sum(not isinstance(w, (bool, np.bool_)) for w in writes)
        notes.append(f"mutates_state left out: unknown for {unknown} of {len(rows)} steps")
    nov = [r[3] for r in rows]
    if all(is_finite(v) for v in nov):
        cols.append([float(v) for v in nov])
        keep.append("novelty")
    else:
        missing = sum(not is_finite(v) for v in nov)
        notes.append(f"novelty left out: missing for {missing} of {len(rows)} steps")
    x = np.array(cols, dtype=float).T.reshape(len(rows), len(cols))
    y = np.array([r[4] for r in rows], dtype=int)
    constant = [i for i in range(x.shape[1]) if np.ptp(x[:, i]) == 0]
    for i in constant:
        notes.append(f"{keep[i]} left out: constant")
    live = [i for i in range(x.shape[1]) if i not in constant]
    return x[:, live], y, [keep[i] for i in live], notes, np.array(groups)


def _fit(x: np.ndarray, y: np.ndarray, c: float) -> tuple[np.ndarray, float]:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=c, max_iter=1000).fit(x, y)
    return model.coef_[0], float(model.intercept_[0])


def _logistic_divergence(
    steps: Iterable[Step], n_boot: int = 200, seed: int = 0, c: float = 100.0
) -> dict:
    """Logistic regression of ``diverged`` on depth, any prior divergence, write flag, novelty.

    Fitted with scikit-learn under a weak L2 penalty (``C=c``) that keeps coefficients finite
    when the data separate. Features unknown for some steps, or constant, are left out (see
    ``note``). ``odds_ratio_prior_divergence`` = exp(coefficient of the prior flag), with a
    percentile CI from ``n_boot`` bootstrap resamples of whole trajectories. Single-class data
    (all steps diverged or none did) yield None values and a note, never an exception.
    """
    steps = scored_steps(steps)
    out: dict = {
        "n": len(steps),
        "features": [],
        "coefficients": None,
        "intercept": None,
        "odds_ratio_prior_divergence": None,
        "odds_ratio_ci": None,
        "note": None,
    }
    if not steps:
        out["note"] = "no scored steps"
        return out
    x, y, names, notes, groups = _design(steps)
    out["features"] = names
    if len(set(y.tolist())) < 2:
        notes.append("cannot fit: " + ("every step diverged" if y[0] else "no step diverged"))
        out["note"] = "; ".join(notes)
        return clean(out)
    if not names:
        notes.append("cannot fit: no feature varies")
        out["note"] = "; ".join(notes)
        return clean(out)
    coef, intercept = _fit(x, y, c)
    out["coefficients"] = dict(zip(names, coef.tolist(), strict=True))
    out["intercept"] = intercept
    if "prior_divergence" in names:
        j = names.index("prior_divergence")
        out["odds_ratio_prior_divergence"] = math.exp(coef[j])
        if n_boot > 0:
            out["odds_ratio_ci"], out["odds_ratio_ci_mc_error"] = _bootstrap_or(
                x, y, groups, j, n_boot, seed, c, notes)
    out["note"] = "; ".join(notes) or None
    return clean(out)



def logistic_divergence(steps: Iterable[Step], **kwargs: object) -> dict:
    """Logistic regression of divergence (see ``_logistic_divergence`` for the arguments).

    The many small bootstrap fits run on one BLAS thread: on a busy machine, threads waiting
    for a core made them 6x slower (measured), and they gain nothing from threads.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return _logistic_divergence(steps, **kwargs)  # type: ignore[arg-type]

def _bootstrap_or(
    x: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    j: int,
    n_boot: int,
    seed: int,
    c: float,
    notes: list[str],
) -> tuple[list | None, float | None]:
    rng = np.random.default_rng(seed)
    members = [np.flatnonzero(groups == g) for g in range(int(groups.max()) + 1)]
    ors = []
    for _ in range(n_boot):
        rows = np.concatenate([members[g] for g in rng.integers(0, len(members), len(members))])
        xb, yb = x[rows], y[rows]
        if len(set(yb.tolist())) < 2 or np.ptp(xb[:, j]) == 0:
            continue
        ors.append(math.exp(min(700.0, _fit(xb, yb, c)[0][j])))
    if len(ors) < n_boot:
        notes.append(f"{n_boot - len(ors)} of {n_boot} bootstrap fits skipped (one class)")
    if not ors:
        return None, None
    return np.quantile(ors, [0.025, 0.975]).tolist(), mc_error(np.array(ors), 0.95)


#: Which figure of the ``compounding`` block (and of the ``history`` block) answers which
#: question: the summary and the report say so beside the figures.
QUESTIONS = {
    "ratio": "are later errors associated with earlier ones? (pooled risk ratio: association "
             "only; trajectories that are simply harder push it above 1)",
    "depth_trend": "do errors grow with depth? (odds ratio of divergence per depth, "
                   "cluster-robust)",
    "history.own_minus_real": "do a model's own errors cause later ones? (envace probe "
                              "--history both: the same calls given its own earlier answers "
                              "minus given the real ones; the causal measure)",
}


def compounding_block(scored: list[Step], n_boot: int, seed: int, z: float) -> dict:
    """The ``compounding`` block: the pooled ratio, the depth trend beside it, and which
    question each answers."""
    block = compounding_ratio(scored, n_boot=n_boot, seed=seed)
    block["depth_trend"] = clean(depth_trend(
        [depth_of(s) for s in scored], [float(bool(s["diverged"])) for s in scored],
        [cluster_of(s) for s in scored], z))
    block["questions"] = dict(QUESTIONS)
    return block
