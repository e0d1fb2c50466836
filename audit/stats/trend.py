"""Do errors grow with depth? A logistic fit of divergence on depth with cluster-robust errors.

The compounding ratio (``audit.stats.compounding.compounding_ratio``) pools every depth:
trajectories that are simply harder push it above 1 even where divergence falls with depth. The
*depth trend* answers the other question: the odds ratio of divergence per step of depth,
``exp(b1)`` in ``logit P(diverged) = b0 + b1 * depth``, fitted by maximum likelihood (IRLS, Newton's
method on the log-likelihood) with a cluster-robust (sandwich) covariance ``V = c * A^-1 (sum_g s_g
s_g^T) A^-1``, where ``A`` is the Fisher information, ``s_g`` the score summed over cluster ``g``
(the resampling unit: steps of one trajectory, and trajectories of one BFCL scenario, are not
independent) and ``c = G / (G - 1)`` the small-sample factor of Stata's and statsmodels'
``cov_type="cluster"`` (with ``use_correction=False`` otherwise). The interval is Wald's on the log
scale, ``exp(b1 +/- z * se)``.

    depth_trend(depths=[0, 1, 2, 0, 1], diverged=[0, 1, 1, 0, 0], clusters=["a"] * 3 + ["b"] * 2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

METHOD = ("logistic regression of diverged on depth (maximum likelihood, IRLS), cluster-robust "
          "sandwich SE (factor G/(G-1)), Wald interval on the log odds")


def logistic_irls(x: np.ndarray, y: np.ndarray, max_iter: int = 100, tol: float = 1e-10
                  ) -> tuple[np.ndarray, bool]:
    """Unpenalised maximum-likelihood logistic coefficients of ``y`` on ``x`` (``x`` holds its
    own intercept column); ``(beta, converged)``. Step-halving keeps every step an ascent."""
    beta = np.zeros(x.shape[1])

    def loglik(b: np.ndarray) -> float:
        eta = x @ b
        return float((y * eta - np.logaddexp(0.0, eta)).sum())

    ll = loglik(beta)
    for _ in range(max_iter):
        p = 1.0 / (1.0 + np.exp(-(x @ beta)))
        info = (x * (p * (1 - p))[:, None]).T @ x
        try:
            step = np.linalg.solve(info, x.T @ (y - p))
        except np.linalg.LinAlgError:
            return beta, False
        t = 1.0
        while t > 1e-8:
            new = beta + t * step
            ll_new = loglik(new)
            if ll_new >= ll - 1e-12:
                break
            t /= 2
        beta, done = new, abs(ll_new - ll) < tol and float(np.abs(t * step).max()) < 1e-8
        ll = ll_new
        if done:
            return beta, True
    return beta, False


def cluster_robust_cov(x: np.ndarray, y: np.ndarray, beta: np.ndarray, clusters: np.ndarray
                       ) -> np.ndarray:
    """The sandwich ``G/(G-1) A^-1 B A^-1`` with scores summed within clusters (integer codes
    ``0..G-1``). One observation per cluster gives White's HC0 times ``n/(n-1)``."""
    p = 1.0 / (1.0 + np.exp(-(x @ beta)))
    bread = np.linalg.inv((x * (p * (1 - p))[:, None]).T @ x)
    g = int(clusters.max()) + 1
    scores = np.zeros((g, x.shape[1]))
    np.add.at(scores, clusters, x * (y - p)[:, None])
    meat = scores.T @ scores
    return (g / (g - 1)) * bread @ meat @ bread


def depth_trend(depths: Sequence[float], diverged: Sequence[float], clusters: Sequence[object],
                z: float = 1.96) -> dict[str, Any]:
    """The odds ratio of divergence per depth with its cluster-robust interval.

    Returns ``odds_ratio_per_depth``, ``ci``, ``log_odds_ratio``, ``se`` (of the log odds ratio),
    ``n``, ``clusters``, ``method`` and ``note`` (why a figure is None: one class, one depth,
    one cluster, separation)."""
    d = np.asarray(depths, dtype=float)
    y = np.asarray(diverged, dtype=float)
    names, codes = np.unique(np.asarray([str(c) for c in clusters], dtype=str),
                             return_inverse=True)
    out: dict[str, Any] = {"odds_ratio_per_depth": None, "ci": None, "log_odds_ratio": None,
                           "se": None, "n": len(y), "clusters": len(names), "method": METHOD,
                           "note": None}
    if len(y) == 0:
        out["note"] = "no scored steps"
        return out
    if y.min() == y.max():
        out["note"] = "cannot fit: " + ("every step diverged" if y[0] else "no step diverged")
        return out
    if d.min() == d.max():
        out["note"] = "cannot fit: every step at one depth"
        return out
    order = np.lexsort((y, d, codes.reshape(-1)))  # a canonical order: input order is moot
    d, y, codes = d[order], y[order], codes.reshape(-1)[order]
    x = np.column_stack([np.ones_like(d), d])
    beta, converged = logistic_irls(x, y)
    if not converged or not np.isfinite(beta).all() or abs(beta[1]) > 30:
        out["note"] = "cannot fit: the data separate by depth (the estimate is infinite)"
        return out
    b = float(beta[1])
    out.update(odds_ratio_per_depth=math.exp(b), log_odds_ratio=b)
    if len(names) < 2:
        out["note"] = "one cluster: no cluster-robust interval"
        return out
    se = math.sqrt(max(0.0, float(cluster_robust_cov(x, y, beta, codes.reshape(-1))[1, 1])))
    out.update(se=se, ci=[math.exp(b - z * se), math.exp(b + z * se)])
    if len(names) < 20:
        out["note"] = (f"only {len(names)} clusters: the sandwich interval may be too narrow "
                       "with fewer than about 20")
    return out
