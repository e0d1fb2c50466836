"""What every page shares: the root, the run picked in the sidebar, messages, formatting.

``app.py`` calls :func:`sidebar` once per rerun; pages call :func:`context` or
:func:`require_run`. The run may be named in the URL (``?run=demo``); a name that resolves
outside the root is refused with a message, never followed. Names, paths and messages that
come from files or the URL go through ``dashboard.safe`` (:func:`md`, :func:`code`) before
they reach markdown.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from dashboard.runs import Audit, OutsideRoot, Run, describe, discover, resolve_inside
from dashboard.safe import code, md
from envace.core.modes import ROLLOUT_MODES, TRAINING_MODES
from envace.core.yaml_load import YamlError, load_yaml

__all__ = ["code", "md"]  # re-exported for the pages

ROOT_ENV = "ENVACE_DASHBOARD_ROOT"
REFRESH_S = 10


@dataclass
class Context:
    """The root, the runs found under it, the chosen run, and a refusal to show, if any."""

    root: Path
    runs: list[Run] = field(default_factory=list)
    run: Run | None = None
    problem: str | None = None


def root_path(argv: list[str] | None = None) -> Path:
    """The root: ``$ENVACE_DASHBOARD_ROOT``, else the first argument after ``--``, else runs/."""
    if os.environ.get(ROOT_ENV):
        return Path(os.environ[ROOT_ENV]).expanduser()
    args = [a for a in (sys.argv if argv is None else argv)[1:] if not a.startswith("-")]
    return Path(args[0]).expanduser() if args else Path("runs")


def _requested(root: Path, runs: list[Run], wanted: str) -> tuple[Run | None, str | None]:
    """The run a URL or the sidebar names: a listed run, or a directory inside the root."""
    for r in runs:
        if r.name == wanted:
            return r, None
    try:
        p = resolve_inside(root, wanted)
    except OutsideRoot as exc:
        return None, f"Refused: {md(exc)}"
    if not p.is_dir():
        return None, f"No directory {code(wanted)} under {code(root)}."
    return describe(root.resolve(), p), None


def label(run: Run) -> str:
    """``name · status`` (plain text: headless browsers may lack an emoji font)."""
    return f"{run.name} · {run.status}"


def _picked() -> None:
    st.query_params["run"] = st.session_state.run_choice  # a pick replaces a refused URL


def sidebar(root: Path) -> Context:
    """Render the run picker; remember and return the context for the pages."""
    ctx = Context(root=root)
    if not root.is_dir():
        ctx.problem = (f"The dashboard root {code(root)} is not a directory. Start it on a "
                       "directory of runs: `envace-dashboard runs/`.")
    else:
        ctx.runs = discover(root)
    names = [r.name for r in ctx.runs]
    by_name = {r.name: r for r in ctx.runs}
    st.sidebar.caption(f"Root: {code(root)}")
    wanted = st.query_params.get("run")
    if wanted and wanted not in by_name and not ctx.problem:
        run, ctx.problem = _requested(root, ctx.runs, wanted)
        if run is not None:
            by_name[run.name] = run
            names.append(run.name)
    if names:
        if "run_choice" in st.session_state and st.session_state.run_choice not in names:
            del st.session_state["run_choice"]
        if wanted in names and st.session_state.get("_url_run") != wanted:
            st.session_state.run_choice = wanted  # the URL names a run: follow it once
        st.session_state._url_run = wanted
        st.session_state.setdefault("run_choice", names[0])
        choice = st.sidebar.selectbox("Run", names, key="run_choice", on_change=_picked,
                                      format_func=lambda n: label(by_name[n]))
        ctx.run = by_name[choice]
        if not ctx.problem:
            st.query_params["run"] = choice
    typed = st.sidebar.text_input("Open a directory inside the root", key="open_dir",
                                  placeholder="e.g. demo/audit/step_5")
    if typed.strip():
        run, err = _requested(root, ctx.runs, typed.strip())
        if err:
            ctx.problem = err
        else:
            ctx.run = run
    if ctx.run is not None:
        st.sidebar.caption(f"{md(ctx.run.kind)} · {md(ctx.run.status)} · "
                           f"{len(ctx.run.audits)} audit(s)")
    st.session_state["_envace_ctx"] = ctx
    return ctx


def context() -> Context:
    """The context ``app.py`` stored for this rerun."""
    ctx = st.session_state.get("_envace_ctx")
    if ctx is None:
        ctx = sidebar(root_path())
    return ctx


def require_run() -> tuple[Context, Run]:
    """The chosen run, or a message on the page and a stop."""
    ctx = context()
    if ctx.problem:
        st.error(ctx.problem)
        st.stop()
    if ctx.run is None:
        st.info(f"No runs found under {code(ctx.root)}. Point the dashboard at a directory holding "
                "training runs (`runs/<name>/`) or audit directories made by "
                "`envace-audit replay ... --out DIR`.")
        st.stop()
    return ctx, ctx.run


def notes(messages: list[str]) -> None:
    """Show reading notes (truncated lines, skipped lines) as warnings (as text: they quote
    the files)."""
    for m in messages:
        st.warning(md(m), icon="⚠️")


def pick_audit(run: Run, key: str, title: str = "Audit") -> Audit | None:
    """A selectbox over the run's audits (latest step first); None with a message if none."""
    if not run.audits:
        st.info(f"No audit yet in {code(run.name)}: audits appear as `audit/step_<N>/` when the "
                "trainer audits its rollouts, or run `envace-audit replay "
                "rollouts/step_<N>.jsonl --out audit/step_<N>`.")
        return None
    options = list(reversed(run.audits))
    if len(options) == 1:
        return options[0]
    return st.selectbox(title, options, key=key, format_func=lambda a: a.label)


def pct(x: float | None, digits: int = 1) -> str:
    """A rate as a percentage ("48.5%"), or "–"."""
    return "–" if x is None else f"{x:.{digits}%}"


def num(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def ci(bounds: list | tuple | None, as_pct: bool = True) -> str:
    if not bounds or bounds[0] is None:
        return "no CI"
    f = pct if as_pct else num
    return f"95% CI [{f(bounds[0])}, {f(bounds[1])}]"


@contextlib.contextmanager
def guard(what: str) -> Iterator[None]:
    """Turn an unexpected error into a message on the page (never a traceback)."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 — the page must stay up whatever the files hold
        st.error(f"Could not show {what}: {type(exc).__name__}: {md(exc)}")


def refresh_every(run: Run) -> str | None:
    """A fragment interval for a run in progress, so its pages refresh on their own."""
    return f"{REFRESH_S}s" if run.status == "running" else None


def mode_line(config_text: str | None) -> str | None:
    """What a training run's mode means (envace.core.modes), from its config.yaml text, as
    escaped markdown; None when the text names no known mode."""
    try:
        mode = (load_yaml(config_text or "") or {}).get("mode")
    except (YamlError, AttributeError):
        return None
    m = TRAINING_MODES.get(mode) if isinstance(mode, str) else None
    if m is None:
        return None
    trains = ", ".join(f"{role} by the {model.replace('_', ' ')}" for role, model in m.trains)
    return (f"Mode {code(m.name)}: {md(m.help)}. Tool calls: {md(ROLLOUT_MODES[m.rollout])} "
            f"(rollout mode {code(m.rollout)}); trained: {md(trains)}.")
