"""Runs page: every run under the root, its status, config and headline figures.

A run in progress (status *running*: a fresh heartbeat from a live process, ``dashboard.runs``)
refreshes itself every few seconds. ``report.md`` is shown as its text, never rendered as
markdown (a report quotes trajectory content: no image or link of it may load); the report's
plots are the PNG files beside it, read and served by the dashboard itself.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import data, ui
from dashboard.readers import read_text
from dashboard.runs import Run, describe, is_inside
from dashboard.safe import code, md
from envace.core.layout import AUDIT, RUN

IMAGE_LINK = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def headline(run: Run) -> dict[str, Any]:
    """The figures a person looks at first: steps, last reward, latest divergence."""
    out: dict[str, Any] = {"steps logged": None, "last reward": None, "latest divergence": None,
                           "divergence CI": None, "compounding ratio": None, "audited calls": None}
    if run.metrics.is_file():
        m = data.metrics(run.metrics).frame
        if not m.empty:
            out["steps logged"] = len(m)
            finite = m["reward/mean"].dropna() if "reward/mean" in m else []
            finite = [float(x) for x in finite if math.isfinite(float(x))]
            if finite:  # the last step with a usable reward (a bad line costs its point only)
                out["last reward"] = finite[-1]
    if run.latest_audit is not None:
        s, _ = data.summary(run.latest_audit.path)
        if s is not None:
            out["latest divergence"] = _finite(s.divergence_rate)
            out["divergence CI"] = s.divergence_ci
            out["compounding ratio"] = _finite(s.compounding.ratio if s.compounding else None)
            out["audited calls"] = s.scored_steps
    return out


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def report_images(run_dir: Path, report: str) -> list[Path]:
    """The PNG files report.md shows, when they lie in the run directory: the dashboard reads
    and serves them itself (a link to anywhere else is never followed)."""
    found = []
    for target in IMAGE_LINK.findall(report):
        if re.match(r"^[a-zA-Z][\w+.-]*:", target) or target.startswith("//"):
            continue  # a URL: never fetched
        p = run_dir / target
        if p.suffix.lower() == ".png" and p.is_file() and is_inside(run_dir, p) \
                and p.resolve() not in found:
            found.append(p.resolve())
    return found


def runs_table(runs: list[Run]) -> pd.DataFrame:
    rows = []
    for r in runs:
        h = headline(r)
        steps = h["steps logged"]
        rows.append({"run": r.name, "status": r.status,
                     "kind": r.kind, "steps logged": "–" if steps is None else str(steps),
                     "last reward": ui.num(h["last reward"]), "audits": len(r.audits),
                     "latest divergence": ui.pct(h["latest divergence"]),
                     "evals": len(r.evals),
                     "modified": dt.datetime.fromtimestamp(r.modified).strftime("%Y-%m-%d %H:%M")})
    return pd.DataFrame(rows)


def details(run: Run) -> None:
    st.subheader(md(ui.label(run)))
    if run.kind == "empty":
        st.info(f"{code(run.name)} holds nothing the dashboard can read yet: no config.yaml, "
                "metrics.jsonl, audit/ or summary.json.")
        return
    h = headline(run)
    cols = st.columns(5)
    cols[0].metric("Status", run.status)
    cols[1].metric("Steps logged", h["steps logged"] if h["steps logged"] is not None else "–")
    cols[2].metric("Last reward", ui.num(h["last reward"]))
    cols[3].metric("Latest divergence rate", ui.pct(h["latest divergence"]),
                   help=ui.ci(h["divergence CI"]))
    cols[4].metric("Compounding ratio", ui.num(h["compounding ratio"], 2))
    if h["divergence CI"]:
        st.caption(f"Latest audit ({md(run.latest_audit.label)}): {md(h['audited calls'])} "
                   f"rehearsed calls, divergence {ui.pct(h['latest divergence'])} "
                   f"{ui.ci(h['divergence CI'])}.")
    if run.metrics.is_file():
        ui.notes(data.metrics(run.metrics).notes)
    elif run.kind == "training":
        st.info(f"No {RUN.metrics} yet: the run has not finished its first step.")
    if run.kind == "eval":
        s, err = data.json_file(run.path / RUN.eval_summary)
        if s:
            st.write(f"Evaluation: success {ui.pct(_finite(s.get('success_rate')))} "
                     f"{ui.ci(s.get('success_ci'))} over {md(s.get('attempts', '–'))} attempts, "
                     f"rehearsal {code(s.get('strategy', '–'))} n={md(s.get('n', '–'))}; plans "
                     "and commits are on the Test-time rehearsal page.")
        elif err:
            st.warning(md(err))
    if run.kind == "audit":
        s, err = data.summary(run.path)
        if err:
            st.warning(md(err))
        elif s is not None:
            st.write(f"Audit of {md(', '.join(s.inputs or []))} · verdict "
                     f"{code(s.verdict.scorer if s.verdict else None)} · audited model "
                     f"{md(s.audited_model or 'the trajectories’ own rehearsals')}")
    cfg = read_text(run.path / RUN.config)
    if run.kind == "training" and (line := ui.mode_line(cfg)):
        st.caption(line)
    left, right = st.columns(2)
    with left, st.expander(RUN.config, expanded=cfg is not None):
        st.code(cfg or f"(no {RUN.config})", language="yaml")
    with right, st.expander("Contents", expanded=True):
        st.markdown("\n".join([
            f"- rollouts: {', '.join(f'step {s}' for s in sorted(run.rollouts)) or 'none'}",
            f"- audits: {md(', '.join(a.label for a in run.audits)) or 'none yet'}",
            f"- evaluations: {md(', '.join(e.name for e in run.evals)) or 'none'}",
            f"- checkpoints: {md(_checkpoints(run)) or 'none'}"]))
    report = read_text(run.path / RUN.report)
    if report:
        with st.expander(RUN.report):
            st.code(report, language="markdown", wrap_lines=True)  # text: nothing it links loads
            for png in report_images(run.path, report):
                st.image(png.read_bytes(), caption=png.name)


def _checkpoints(run: Run) -> str:
    d = run.path / RUN.checkpoints
    if not d.is_dir():
        return ""
    return ", ".join(sorted(p.name for p in d.iterdir() if p.is_dir()))


ctx = ui.context()
st.title("Runs")
if ctx.problem:
    st.error(ctx.problem)
if not ctx.runs:
    if not ctx.problem:
        st.info(f"No runs found under `{ctx.root}`: it is empty or holds no run directory "
                f"({RUN.config}, {RUN.metrics}, {RUN.audit}/) and no audit directory "
                f"({AUDIT.summary}, {AUDIT.steps}).")
    st.stop()

with ui.guard("the list of runs"):
    st.table(runs_table(ctx.runs).set_index("run"))
if ctx.run is not None and not ctx.problem:
    run = ctx.run

    @st.fragment(run_every=ui.refresh_every(run))
    def _live() -> None:
        fresh = describe(ctx.root.resolve(), run.path)  # re-read the files on each refresh
        with ui.guard("this run"):
            details(fresh)
        if fresh.status == "running":
            st.caption(f"Refreshing every {ui.REFRESH_S} s while the run is in progress.")

    _live()
