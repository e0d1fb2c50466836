"""envace inspection dashboard: the Streamlit entry point.

    envace-dashboard runs/                         (serves on 127.0.0.1)
    streamlit run dashboard/app.py -- runs/        (the same, by hand)
    streamlit run dashboard/app.py -- runs/demo/audit/step_5   (one audit directory)

The root is ``$ENVACE_DASHBOARD_ROOT`` if set (tests, and ``envace-dashboard``, set it), else the
first argument after ``--``, else ``runs/``.
Pages: Runs, Training, Fidelity, Trajectories, Compare, Test-time rehearsal, Board (boards of
``envace board`` under the root); the run is picked in the sidebar (or named in the URL:
``/fidelity?run=demo``). Reads files only: never imports torch or the trainer.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # `streamlit run dashboard/app.py` from a checkout
    sys.path.insert(0, str(HERE.parent))

import streamlit as st  # noqa: E402

from dashboard import ui  # noqa: E402

PAGES = [
    ("views/runs.py", "Runs", ":material/folder_open:"),
    ("views/training.py", "Training", ":material/show_chart:"),
    ("views/fidelity.py", "Fidelity", ":material/fact_check:"),
    ("views/trajectories.py", "Trajectories", ":material/forum:"),
    ("views/compare.py", "Compare", ":material/compare_arrows:"),
    ("views/rehearsal.py", "Test-time rehearsal", ":material/psychology:"),
    ("views/board.py", "Board", ":material/leaderboard:"),
]


def main() -> None:
    st.set_page_config(page_title="envace dashboard", page_icon="🧭", layout="wide")
    pages = [st.Page(str(HERE / path), title=title, icon=icon, default=i == 0)
             for i, (path, title, icon) in enumerate(PAGES)]
    nav = st.navigation(pages)
    ui.sidebar(ui.root_path())
    nav.run()


main()
