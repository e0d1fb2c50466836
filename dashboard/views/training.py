"""Training page: every numeric key of ``metrics.jsonl`` over steps, grouped by prefix.

Reward (overall and by role), loss, KL, clip fractions, entropy, tokens by role and fidelity
share one x axis (step, or wall time). A key the trainer adds later appears in its prefix's
chart without code changes. Fidelity measured by the run's audits is drawn on the same axis.
Where each step's time went (the ``time/*`` sections, which add up to ``time/step``) is a
stacked chart.
The held-out bits per byte (``fidelity_bpb``, logged with ``fidelity_nll_every``) is one line
beside the fidelity chart: each point after the number of updates done (the run's last point,
``fidelity_bpb_end``, after its last update).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, data, ui
from dashboard.readers import metric_groups
from dashboard.runs import Run, describe

ORDER = ["reward", "loss", "kl", "clip_frac", "entropy", "tokens", "tokens_per_s", "fidelity",
         "fidelity_bpb", "fidelity/depth", "adv"]
BPB = "fidelity_bpb"  # the held-out curve; its _tokens/_steps counts stay in the table
BPB_KEYS = {f"{BPB}{end}{n}" for end in ("", "_end") for n in ("", "_tokens", "_steps")}
BPB_TITLE = "Bits per byte of real responses, held-out dev batch (lower: closer to the world)"
TIME_TITLE = "Where each step's time went (seconds)"
TITLES = {"reward": "Reward (overall and by role)", "loss": "Loss", "kl": "KL to reference",
          "clip_frac": "Clip fraction by role", "entropy": "Entropy", "tokens": "Tokens by role",
          "tokens_per_s": "Throughput (tokens/s)", "fidelity": "Fidelity (logged by the trainer)",
          "fidelity/depth": "Divergence rate by depth (logged by the trainer)",
          "adv": "Advantage by role"}
HEADLINE = [("reward/mean", "Reward", ui.num, "normal"), ("loss", "Loss", ui.num, "inverse"),
            ("kl", "KL", ui.num, "off"),
            ("fidelity/divergence_rate", "Divergence rate", ui.pct, "inverse")]


def _last(frame: pd.DataFrame, col: str) -> tuple[float | None, float | None]:
    if col not in frame or frame[col].notna().sum() == 0:
        return None, None
    s = frame[col].dropna()
    return float(s.iloc[-1]), float(s.iloc[-1] - s.iloc[0]) if len(s) > 1 else None


def bpb_curve(frame: pd.DataFrame, x: str) -> pd.DataFrame:
    """The held-out curve as ``x`` and ``fidelity_bpb``: each measured step's figure (taken
    before its update), then the last row's ``fidelity_bpb_end`` one update later (on the step
    axis; at the same moment on the time axis)."""
    cols = [x, BPB]
    out = frame[cols].dropna() if BPB in frame else pd.DataFrame(columns=cols)
    if f"{BPB}_end" in frame:
        end = frame[[x, f"{BPB}_end"]].dropna().rename(columns={f"{BPB}_end": BPB})
        if x == "step":
            end = end.assign(step=end["step"] + 1)
        out = pd.concat([out, end], ignore_index=True)
    return out.astype(float).sort_values(x, kind="stable")


def page(run: Run) -> None:
    if run.kind in ("audit", "eval"):
        what = "an audit" if run.kind == "audit" else "an evaluation"
        st.info(f"`{run.name}` is {what} directory, not a training run: it has no "
                "metrics.jsonl. Its figures are on the Fidelity, Trajectories and Test-time "
                "rehearsal pages.")
        return
    if not run.metrics.is_file():
        st.info(f"No metrics yet in `{run.name}`: metrics.jsonl appears after the first "
                "optimizer step.")
        return
    got = data.metrics(run.metrics)
    ui.notes(got.notes)
    frame = got.frame
    if frame.empty:
        st.info("metrics.jsonl holds no complete record yet.")
        return
    axis = st.radio("x axis", ["step", "time"], horizontal=True, key="train_axis",
                    disabled="time" not in frame)
    x = axis if axis in frame else "step"
    if x == "time":
        frame = frame.assign(minutes=(frame["time"] - frame["time"].min()) / 60.0)
        x = "minutes"
    domain = [float(frame[x].min()), float(frame[x].max())]
    cols = st.columns(len(HEADLINE))
    for col, (key, title, fmt, sense) in zip(cols, HEADLINE, strict=True):
        last, delta = _last(frame, key)
        col.metric(title, fmt(last), None if delta is None else f"{delta:+.3g} since start",
                   delta_color=sense)
    st.caption(f"{len(frame)} steps logged, last step {int(frame['step'].iloc[-1])}.")
    groups = metric_groups(list(frame.columns))
    # the step's sections stack up to its whole (time/step, left out of the stack)
    sections = [c for c in groups.pop("time", []) if c != "time/step"]
    for key in BPB_KEYS:
        groups.pop(key, None)
    curve = bpb_curve(frame, x)
    if not curve.empty:
        groups[BPB] = [BPB]
        domain[1] = max(domain[1], float(curve[x].max()))  # the end point, one update later
    names = sorted(groups, key=lambda g: (ORDER.index(g) if g in ORDER else len(ORDER), g))
    grid = st.columns(2)
    for i, g in enumerate(names):
        with grid[i % 2]:
            st.altair_chart(charts.lines(curve if g == BPB else frame, x, groups[g],
                                         BPB_TITLE if g == BPB else TITLES.get(g, g),
                                         x_title=x, domain=domain), width="stretch")
    if sections:
        with grid[len(names) % 2]:
            st.altair_chart(charts.stacked(frame, x, sections, TIME_TITLE, x_title=x,
                                           domain=domain), width="stretch")
        names.append("time")
    trend = data.audit_trend(run.audits)
    if x == "step" and not trend.empty:
        with grid[len(names) % 2]:
            st.altair_chart(charts.band(trend, "step", "divergence_rate", "lo", "hi",
                                        "Divergence rate measured by the audits", "divergence",
                                        domain=domain), width="stretch")
    with st.expander("All logged values"):
        st.dataframe(frame, hide_index=True)


ctx, run = ui.require_run()
st.title("Training")


@st.fragment(run_every=ui.refresh_every(run))
def _live() -> None:
    with ui.guard("the training curves"):
        page(describe(ctx.root.resolve(), run.path))


_live()
