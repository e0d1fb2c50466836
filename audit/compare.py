"""Two audits side by side (two checkpoints, two simulators), with significance.

Unpaired figures: divergence rate (two-proportion z-test, CI of the difference), each scorer's
mean (Welch's t-test). When both audits scored the same calls (same task, step, tool and
arguments, e.g. two simulators over one trajectory file) the steps are also paired and McNemar's
exact test is run on the divergence verdicts, which is far more sensitive.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

from audit.compounding import clean


def _load(dir_: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((dir_ / "summary.json").read_text())
    steps = []
    with open(dir_ / "steps.jsonl", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                try:
                    steps.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a truncated last line: the summary says what was audited
    return summary, [s for s in steps if not s.get("unanswered")]


def _key(s: dict) -> str:
    return json.dumps([s["task_id"], s["step"], s["tool"], s["arguments"]], sort_keys=True)


def two_proportions(k1: int, n1: int, k2: int, n2: int) -> dict[str, Any]:
    from scipy.stats import norm

    if not n1 or not n2:
        return {"diff": None, "ci": None, "p_value": None}
    p1, p2 = k1 / n1, k2 / n2
    diff = p2 - p1
    se = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    pool = (k1 + k2) / (n1 + n2)
    se0 = math.sqrt(pool * (1 - pool) * (1 / n1 + 1 / n2))
    p = 2 * norm.sf(abs(diff) / se0) if se0 > 0 else (1.0 if diff == 0 else 0.0)
    return {"diff": diff, "ci": [diff - 1.96 * se, diff + 1.96 * se], "p_value": p}


def welch(a: list[float], b: list[float]) -> dict[str, Any]:
    from scipy.stats import ttest_ind

    if len(a) < 2 or len(b) < 2:
        return {"diff": None, "p_value": None}
    diff = sum(b) / len(b) - sum(a) / len(a)
    with warnings.catch_warnings():  # identical samples: scipy warns, the p-value is still 1
        warnings.simplefilter("ignore", RuntimeWarning)
        res = ttest_ind(a, b, equal_var=False)
    p = float(res.pvalue) if math.isfinite(res.pvalue) else (1.0 if diff == 0 else None)
    return {"diff": diff, "p_value": p}


def mcnemar(a: list[bool], b: list[bool]) -> dict[str, Any]:
    from scipy.stats import binomtest

    only_a = sum(x and not y for x, y in zip(a, b, strict=True))
    only_b = sum(y and not x for x, y in zip(a, b, strict=True))
    n = only_a + only_b
    p = binomtest(only_a, n, 0.5).pvalue if n else 1.0
    return {"pairs": len(a), "only_a_diverged": only_a, "only_b_diverged": only_b,
            "p_value": float(p)}


def compare_audits(dir_a: str | Path, dir_b: str | Path, alpha: float = 0.05) -> dict[str, Any]:
    sa, a = _load(Path(dir_a))
    sb, b = _load(Path(dir_b))
    ka, kb = sum(bool(s["diverged"]) for s in a), sum(bool(s["diverged"]) for s in b)
    out: dict[str, Any] = {
        "a": str(dir_a), "b": str(dir_b), "alpha": alpha,
        "steps": {"a": len(a), "b": len(b)},
        "divergence_rate": {"a": ka / len(a) if a else None, "b": kb / len(b) if b else None,
                            **two_proportions(ka, len(a), kb, len(b))},
        "scores": {},
        "compounding_ratio": {"a": (sa.get("compounding") or {}).get("ratio"),
                              "b": (sb.get("compounding") or {}).get("ratio")},
    }
    for name in sorted(set(sa.get("scorers", [])) & set(sb.get("scorers", []))):
        va = [s["scores"][name] for s in a if name in s["scores"]]
        vb = [s["scores"][name] for s in b if name in s["scores"]]
        out["scores"][name] = {"a": sum(va) / len(va) if va else None,
                               "b": sum(vb) / len(vb) if vb else None, **welch(va, vb)}
    index_b = {_key(s): s for s in b}
    pairs = [(s, index_b[_key(s)]) for s in a if _key(s) in index_b]
    if pairs:
        out["paired"] = mcnemar([bool(x["diverged"]) for x, _ in pairs],
                                [bool(y["diverged"]) for _, y in pairs])
    for block in [out["divergence_rate"], out.get("paired", {}), *out["scores"].values()]:
        if block.get("p_value") is not None:
            block["significant"] = block["p_value"] < alpha
    return clean(out)


def render_compare(c: dict[str, Any]) -> str:
    def f(x: Any) -> str:
        return "–" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))

    dr = c["divergence_rate"]
    lines = [f"# Audit comparison\n\nA = {c['a']}  \nB = {c['b']}\n",
             "| figure | A | B | B − A | p | significant |", "|---|---|---|---|---|---|",
             f"| divergence rate | {f(dr['a'])} | {f(dr['b'])} | {f(dr['diff'])} | "
             f"{f(dr['p_value'])} | {dr.get('significant', '–')} |"]
    for name, v in c["scores"].items():
        lines.append(f"| mean {name} | {f(v['a'])} | {f(v['b'])} | {f(v['diff'])} | "
                     f"{f(v['p_value'])} | {v.get('significant', '–')} |")
    cr = c["compounding_ratio"]
    lines.append(f"| compounding ratio | {f(cr['a'])} | {f(cr['b'])} | | | |")
    if "paired" in c:
        p = c["paired"]
        lines += ["", f"Paired on {p['pairs']} identical calls: only A diverged "
                      f"{p['only_a_diverged']}, only B {p['only_b_diverged']}; McNemar exact "
                      f"p = {f(p['p_value'])} "
                      f"({'significant' if p.get('significant') else 'n.s.'})."]
    return "\n".join(lines) + "\n"
