"""The rehearsal sweep's results as the markdown table of ``docs/results.md`` (no model runs).

    .venv/bin/python -m experiments.sweep_markdown rehearsal_sweep_tiny rehearsal_sweep_tiny_trained

One row per setting of each ``bench/results/<name>.json``: success with its interval, mean reward,
the paired difference from the same model without rehearsal, rehearsal tokens per task, and the
share of rehearsed responses that diverge from reality (rehearsed steps only, trajectory-bootstrap
interval, steps / plans counted).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bench.machine import RESULTS


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def _ci(ci: list[float | None] | None, scale: float = 100.0, fmt: str = "{:.1f}") -> str:
    if not ci or ci[0] is None:
        return ""
    return f" [{fmt.format(scale * ci[0])}, {fmt.format(scale * ci[1])}]"


def row(key: str, r: dict[str, Any]) -> str:
    """One markdown row of a sweep setting."""
    label, strategy, n, *world = key.split("/")  # a 4th part: who answered the plans
    if world:
        strategy = f"{strategy}, {world[0]}"
    diff = r.get("reward_diff_vs_none")
    d = "–" if not diff else (f"{diff['mean']:+.3f}" + _ci(diff["ci"], 1.0, "{:+.3f}"))
    if diff and diff["ci"] and (diff["ci"][0] > 0 or diff["ci"][1] < 0):
        d = f"**{d}**"
    audit = r.get("rehearsal_audit") or {}
    div = "–"
    if audit.get("divergence_rate") is not None:
        div = (f"{_pct(audit['divergence_rate'])}{_ci(audit.get('divergence_ci'))} "
               f"({audit.get('steps')} steps, {audit.get('trajectories')} plans)")
    tokens = round((r.get("budget") or {}).get("rehearsal_tokens", 0))
    return (f"| {label} | {strategy} | {n} | {_pct(r['success_rate'])}{_ci(r['success_ci'])} | "
            f"{r['reward_mean']:.3f} | {d} | {tokens} | {div} |")


def markdown(names: list[str]) -> str:
    """The table for these results files, settings in their stored order."""
    lines = ["| model | rehearsal | N | success (95 % CI) | reward | reward difference vs none "
             "(95 % CI) | rehearsal tokens / task | rehearsed responses diverging (95 % CI) |",
             "|---|---|---|---|---|---|---|---|"]
    for name in names:
        res = json.loads((RESULTS / f"{name}.json").read_text())
        lines += [row(k, r) for k, r in res["settings"].items()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="+", help="results names (bench/results/<name>.json)")
    print(markdown(ap.parse_args().names))


if __name__ == "__main__":
    main()
