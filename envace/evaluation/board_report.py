"""``board.md`` and one chart per environment (``charts/<env>.png``) of a board.

The markdown has one table per environment, models ranked by exact with its interval, then
json_f1, the skill against the environment's best reference, divergence by state leaves
changed (0 / 1 / 2 / 3+), read vs write, bits per byte where scored, coverage at ≤ 5 %
divergence and the AUROC where a model's confidence was recorded, own − real history divergence
where both histories were probed (these columns only where a cell of the environment has them),
and each cell's audit directory. The chart draws every model's exact score with its interval
as an error bar.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envace.core.board import Board, Cell, Interval, env_dirname
from envace.core.envs.statediff import BUCKETS
from envace.core.outfile import atomic_output, write_text
from envace.core.text import markdown_safe as md


def _iv(v: Interval | None, pct: bool = False) -> str:
    if v is None or v.point is None:
        return "–"
    f = (lambda x: f"{x:.1%}") if pct else (lambda x: f"{x:.3f}")
    if v.lo is None or v.hi is None:
        return f(v.point)
    return f"{f(v.point)} [{f(v.lo)}, {f(v.hi)}]"


def _rank(cells: list[Cell]) -> list[Cell]:
    return sorted(cells, key=lambda c: (c.status != "done", -(c.exact.point or -1.0), c.model))


def env_cells(board: Board, env: str) -> list[Cell]:
    return _rank([c for c in board.cells if c.env == env])


def render(board: Board, charts: dict[str, str]) -> str:
    lines = [f"# World-model board — split `{board.split}`", ""]
    if board.command:
        lines += [f"Made by `{board.command}`.", ""]
    lines += ["Each cell is an audit directory (open it with `envace-dashboard`); exact and "
              "json_f1 are mean scores over the scored calls with the audit's cluster-bootstrap "
              "95% interval; skill is exact skill against the best reference world model of "
              "the environment (built from its train split); the state-change columns are the "
              "divergence rate on calls that changed 0, 1, 2, 3+ leaves of the real state.", ""]
    for env in board.envs:
        cells = env_cells(board, env)
        best = next((c.best_reference for c in cells if c.best_reference), None)
        lines += [f"## {md(env)}", "", f"Best reference: `{best or 'n/a'}`.", ""]
        if env in charts:
            lines += [f"![{md(env)}]({charts[env]})", ""]
        conf = any(c.coverage_at_5pct is not None for c in cells)
        hist = any(c.history_diff is not None for c in cells)
        head = ["model", "exact", "json_f1", "skill", *[f"div. {b}" for b in BUCKETS],
                "cliff", "read exact", "write exact", "bits/byte",
                *(["coverage ≤5% div.", "AUROC"] if conf else []),
                *(["own − real div."] if hist else []), "calls", "audit"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for c in cells:
            if c.status != "done":
                lines.append(f"| {md(c.model)} | failed: {md(c.error or '')} |"
                             + " |" * (len(head) - 2))
                continue
            sc = [_iv(c.by_state_change[b].divergence, True) if b in c.by_state_change else "–"
                  for b in BUCKETS]
            rw = [_iv(c.read_write[k].exact) if k in c.read_write else "–"
                  for k in ("read", "write")]
            cliff = {True: "yes", False: "no", None: "–"}[c.cliff]
            extra = ([_iv(Interval(point=c.coverage_at_5pct), True), _iv(c.auroc)]
                     if conf else []) + ([_iv(c.history_diff, True)] if hist else [])
            lines.append("| " + " | ".join([md(c.model), _iv(c.exact), _iv(c.json_f1),
                                            _iv(c.skill), *sc, cliff, *rw,
                                            _iv(c.bits_per_byte), *extra, str(c.calls or 0),
                                            f"[{md(c.dir)}]({c.dir}/report.md)"]) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def chart(board: Board, env: str, out: Path) -> bool:
    """The exact score of every finished cell of ``env`` with its interval; False when none."""
    cells = [c for c in env_cells(board, env) if c.status == "done" and c.exact.point is not None]
    if not cells:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = cells[::-1]  # best at the top
    pts = [c.exact.point for c in cells]
    lo = [c.exact.point - (c.exact.lo if c.exact.lo is not None else c.exact.point)
          for c in cells]
    hi = [(c.exact.hi if c.exact.hi is not None else c.exact.point) - c.exact.point
          for c in cells]
    fig, ax = plt.subplots(figsize=(6.4, 0.45 * len(cells) + 1.2))
    ax.barh(range(len(cells)), pts, xerr=[lo, hi], color="#4c78a8", ecolor="#333", capsize=3)
    ax.set_yticks(range(len(cells)), [c.model for c in cells])
    ax.set_xlim(0, 1)
    ax.set_xlabel("exact (mean score, 95% cluster-bootstrap interval)")
    ax.set_title(f"{env} — split {board.split}")
    fig.tight_layout()
    try:
        with atomic_output(out) as tmp:  # never through a link, never half written
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)
    return True


def write_report(root: Path, board: Board) -> dict[str, Any]:
    """Write ``board.md`` and ``charts/<env>.png``; the charts written, by environment."""
    charts = {}
    for env in board.envs:
        rel = f"charts/{env_dirname(env)}.png"
        if chart(board, env, root / rel):
            charts[env] = rel
    write_text(root / "board.md", render(board, charts))
    return charts
