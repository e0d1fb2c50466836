"""Board page: every world model scored on every environment (``envace board``'s board.json).

Boards are found under the dashboard's root (a ``board.json`` at most three levels down, or the
root itself). Per environment: a sortable table of the cells (exact and json_f1 with intervals,
skill against the environment's best reference, divergence by state leaves changed, read vs
write, bits per byte where scored, coverage at ≤ 5 % divergence and AUROC where confidence was
recorded, own − real history divergence where both histories were probed) with links that
open each cell's audit on the Fidelity and Trajectories pages, and a chart of exact with its
interval. Reads files only.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import ui
from dashboard.runs import is_inside
from dashboard.safe import code, md
from envace.core.board import BOARD_FILE, Board, BoardError, read_board
from envace.core.envs.statediff import BUCKETS

MAX_DEPTH = 3


def find_boards(root: Path, max_depth: int = MAX_DEPTH) -> list[Path]:
    """Directories holding a ``board.json`` under ``root`` (the root included), sorted."""
    root = root.resolve()
    found: list[Path] = []
    frontier = [(root, 0)]
    while frontier:
        d, depth = frontier.pop()
        if (d / BOARD_FILE).is_file():
            found.append(d)
            continue  # a board's own cells are not boards
        if depth >= max_depth:
            continue
        try:
            subs = [p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")]
        except OSError:
            continue
        frontier += [(p, depth + 1) for p in subs if is_inside(root, p)]
    return sorted(found)


def cell_frame(board: Board, env: str, board_dir: Path, root: Path) -> pd.DataFrame:
    """One row per cell of ``env``: figures and links to the cell's audit pages."""
    rows = []
    for c in board.cells:
        if c.env != env:
            continue
        rel = (board_dir / c.dir).resolve()
        run = str(rel.relative_to(root.resolve())) if is_inside(root, rel) else None
        row = {"model": c.model, "status": c.status, "exact": c.exact.point,
               "exact lo": c.exact.lo, "exact hi": c.exact.hi, "json_f1": c.json_f1.point,
               "skill": c.skill.point, "skill lo": c.skill.lo, "skill hi": c.skill.hi,
               "best reference": c.best_reference, "calls": c.calls}
        for b in BUCKETS:
            s = c.by_state_change.get(b)
            row[f"div. {b} leaves"] = s.divergence.point if s else None
        row["cliff"] = {True: "yes", False: "no", None: ""}[c.cliff]
        for k in ("read", "write"):
            s = c.read_write.get(k)
            row[f"{k} exact"] = s.exact.point if s else None
        row["bits/byte"] = c.bits_per_byte.point if c.bits_per_byte else None
        row["coverage ≤5% div."] = c.coverage_at_5pct
        row["AUROC"] = c.auroc.point if c.auroc else None
        h = c.history_diff
        row["own − real div."] = h.point if h else None
        row["own − real lo"] = h.lo if h else None
        row["own − real hi"] = h.hi if h else None
        row["fidelity"] = f"/fidelity?run={quote(run)}" if run else None
        row["trajectories"] = f"/trajectories?run={quote(run)}" if run else None
        row["error"] = c.error
        rows.append(row)
    df = pd.DataFrame(rows)
    return df.sort_values("exact", ascending=False, na_position="last") if not df.empty else df


def exact_chart(df: pd.DataFrame, env: str) -> alt.Chart:
    """Exact per model with its interval as an error bar."""
    data = df.dropna(subset=["exact"])
    base = alt.Chart(data, title=f"{env}: exact, 95% interval",
                     height=max(120, 28 * len(data))).encode(
        y=alt.Y("model:N", sort="-x", title=None))
    bars = base.mark_bar().encode(
        x=alt.X("exact:Q", scale=alt.Scale(domain=[0, 1]), title="exact"),
        tooltip=["model", alt.Tooltip("exact:Q", format=".3f"),
                 alt.Tooltip("exact lo:Q", format=".3f"), alt.Tooltip("exact hi:Q", format=".3f")])
    return bars + base.mark_errorbar().encode(x="exact lo:Q", x2="exact hi:Q")


def page(root: Path) -> None:
    boards = find_boards(root) if root.is_dir() else []
    if not boards:
        st.info(f"No board under {code(root)}: make one with `envace board --models "
                "models.yaml --envs bfcl agentdojo tau2 --out boards/dev` inside the root.")
        return
    names = [str(b.relative_to(root.resolve())) if b != root.resolve() else "." for b in boards]
    pick = st.selectbox("Board", names, key="board_pick") if len(names) > 1 else names[0]
    board_dir = boards[names.index(pick)]
    try:
        board = read_board(board_dir)
    except BoardError as exc:
        st.error(md(str(exc)))
        return
    st.caption(f"{md(pick)} · split {code(board.split)} · {len(board.cells)} cell(s)"
               + (f" · made by {code(board.command)}" if board.command else ""))
    failed = [c for c in board.cells if c.status != "done"]
    if failed:
        st.warning(f"{len(failed)} cell(s) failed: "
                   + "; ".join(f"{md(c.model)} × {md(c.env)}: {md(c.error or '')}"
                               for c in failed))
    links = {"fidelity": st.column_config.LinkColumn("fidelity", display_text="Fidelity"),
             "trajectories": st.column_config.LinkColumn("trajectories",
                                                         display_text="Trajectories")}
    for env in board.envs:
        st.subheader(env)
        df = cell_frame(board, env, board_dir, root)
        if df.empty:
            st.info("No cell of this environment yet.")
            continue
        best = df["best reference"].dropna()
        st.write(f"Best reference: {code(best.iloc[0]) if len(best) else 'n/a'}. Click a "
                 "column to sort; the links open the cell's audit.")
        st.altair_chart(exact_chart(df, env), width="stretch")
        st.dataframe(df, hide_index=True, column_config=links, key=f"board_{env}")


ctx = ui.context()
st.title("Board")
if ctx.problem:  # a refused URL or typed path, a root that is not a directory: as every page
    st.error(ctx.problem)
    st.stop()
with ui.guard("the board"):
    page(ctx.root)
