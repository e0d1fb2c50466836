"""Altair chart builders for the pages (pure: data in, chart out; no Streamlit calls).

Confidence intervals are drawn as shaded bands; the survival curve as a step line. Every builder
accepts plain rows (lists of dicts as found in ``summary.json``) or a DataFrame.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

HEIGHT = 220


def _frame(rows: list[dict[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    return rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)


def lines(frame: pd.DataFrame, x: str, cols: list[str], title: str,
          x_title: str | None = None, domain: list[float] | None = None) -> alt.Chart:
    """One line per column against ``x`` (missing values leave gaps; points mark samples).

    ``domain`` fixes the x range, so charts of one run share the same time axis.
    """
    long = frame[[x, *cols]].melt(id_vars=x, var_name="metric", value_name="value").dropna()
    scale = alt.Scale(domain=domain) if domain else alt.Undefined
    base = alt.Chart(long, title=title, height=HEIGHT).encode(
        x=alt.X(f"{x}:Q", title=x_title or x, scale=scale),
        y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=False)),
        color=alt.Color("metric:N", legend=alt.Legend(orient="bottom", title=None, columns=3,
                                                      labelLimit=220)),
        tooltip=[x, "metric", alt.Tooltip("value:Q", format=".4g")],
    )
    return base.mark_line() + base.mark_circle(size=28)


def stacked(frame: pd.DataFrame, x: str, cols: list[str], title: str,
            x_title: str | None = None, domain: list[float] | None = None,
            y_title: str = "seconds") -> alt.Chart:
    """Stacked areas of ``cols`` against ``x`` (parts of a whole, e.g. a step's time by
    section), with a point per sample carrying each part's value as a tooltip."""
    long = frame[[x, *cols]].melt(id_vars=x, var_name="part", value_name="value").dropna()
    scale = alt.Scale(domain=domain) if domain else alt.Undefined
    base = alt.Chart(long, title=title, height=HEIGHT).encode(
        x=alt.X(f"{x}:Q", title=x_title or x, scale=scale),
        y=alt.Y("value:Q", title=y_title, stack="zero"),
        color=alt.Color("part:N", sort=cols, legend=alt.Legend(
            orient="bottom", title=None, columns=3, labelLimit=220)),
        order=alt.Order("part_order:Q"),
        tooltip=[x, "part", alt.Tooltip("value:Q", format=".3g")],
    ).transform_calculate(part_order=f"indexof({cols!r}, datum.part)")
    return base.mark_area(opacity=0.85) + base.mark_circle(size=18)


def band(rows: list[dict[str, Any]] | pd.DataFrame, x: str, y: str, lo: str, hi: str,
         title: str, y_title: str, series: str | None = None, percent: bool = True,
         domain: list[float] | None = None) -> alt.Chart:
    """A line with a shaded confidence band; ``series`` draws one colored line per value."""
    df = _frame(rows).dropna(subset=[y])
    fmt = ".0%" if percent else ".3g"
    scale = alt.Scale(domain=domain) if domain else alt.Undefined
    enc: dict[str, Any] = {"x": alt.X(f"{x}:Q", title=x, axis=alt.Axis(tickMinStep=1),
                                      scale=scale)}
    if series:
        enc["color"] = alt.Color(f"{series}:N", legend=alt.Legend(orient="bottom", title=None))
    base = alt.Chart(df, title=title, height=HEIGHT).encode(**enc)
    area = base.mark_area(opacity=0.2).encode(y=alt.Y(f"{lo}:Q", title=y_title,
                                                      axis=alt.Axis(format=fmt)), y2=f"{hi}:Q")
    tips = [x, alt.Tooltip(f"{y}:Q", format=".3f"), alt.Tooltip(f"{lo}:Q", format=".3f"),
            alt.Tooltip(f"{hi}:Q", format=".3f")] + ([series] if series else [])
    line = base.mark_line(point=True).encode(y=f"{y}:Q", tooltip=tips)
    return area + line


def survival(rows: list[dict[str, Any]]) -> alt.Chart:
    """Kaplan–Meier curve of the first divergence, with its confidence band."""
    df = pd.DataFrame([{"depth": r["depth"], "survival": r["survival"],
                        "lo": (r.get("ci") or [None, None])[0],
                        "hi": (r.get("ci") or [None, None])[1]} for r in rows])
    base = alt.Chart(df, title="P(no divergence up to depth)", height=HEIGHT).encode(
        x=alt.X("depth:Q", axis=alt.Axis(tickMinStep=1)))
    area = base.mark_area(opacity=0.2, interpolate="step-after").encode(
        y=alt.Y("lo:Q", title="survival", scale=alt.Scale(domain=[0, 1])), y2="hi:Q")
    line = base.mark_line(interpolate="step-after", point=True).encode(
        y="survival:Q", tooltip=["depth", alt.Tooltip("survival:Q", format=".3f")])
    return area + line


def hazard(rows: list[dict[str, Any]]) -> alt.Chart:
    """Per depth: the share of still-undiverged trajectories that diverge there."""
    df = pd.DataFrame(rows)
    return alt.Chart(df, title="Hazard of a first divergence", height=HEIGHT).mark_bar().encode(
        x=alt.X("depth:O"), y=alt.Y("hazard:Q", axis=alt.Axis(format=".0%")),
        tooltip=["depth", "at_risk", "events", alt.Tooltip("hazard:Q", format=".3f")])


def conditional(rows: list[dict[str, Any]]) -> alt.Chart:
    """P(diverge | an earlier divergence) against P(diverge | none), per depth."""
    long = []
    for r in rows:
        for key, label in (("p_after_divergence", "after an earlier divergence"),
                           ("p_no_prior_divergence", "no earlier divergence")):
            if r.get(key) is not None:
                long.append({"depth": r["depth"], "p": r[key], "history": label})
    df = pd.DataFrame(long, columns=["depth", "p", "history"])
    return alt.Chart(df, title="Divergence given the history", height=HEIGHT).mark_line(
        point=True).encode(x=alt.X("depth:Q", axis=alt.Axis(tickMinStep=1)),
                           y=alt.Y("p:Q", axis=alt.Axis(format=".0%"), title="P(diverge)"),
                           color=alt.Color("history:N", legend=alt.Legend(orient="bottom")),
                           tooltip=["depth", "history", alt.Tooltip("p:Q", format=".3f")])


def strata_bars(rows: pd.DataFrame, label: str, title: str) -> alt.Chart:
    """Divergence rate per stratum with its Wilson interval as an error bar."""
    base = alt.Chart(rows, title=title, height=max(HEIGHT, 16 * len(rows))).encode(
        y=alt.Y(f"{label}:N", sort="-x", title=None))
    bars = base.mark_bar().encode(
        x=alt.X("divergence_rate:Q", axis=alt.Axis(format=".0%"), title="divergence rate",
                scale=alt.Scale(domain=[0, 1])),
        tooltip=[label, "n", alt.Tooltip("divergence_rate:Q", format=".3f")])
    err = base.mark_errorbar().encode(x="lo:Q", x2="hi:Q")
    return bars + err


def grouped_bars(df: pd.DataFrame, cat: str, value: str, series: str, title: str) -> alt.Chart:
    """Side-by-side bars of ``value`` per ``cat`` for each ``series`` (A vs B)."""
    return alt.Chart(df, title=title, height=alt.Step(26)).mark_bar().encode(
        y=alt.Y(f"{cat}:N", title=None), yOffset=f"{series}:N",
        x=alt.X(f"{value}:Q", axis=alt.Axis(format=".0%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color(f"{series}:N", legend=alt.Legend(orient="bottom", title=None)),
        tooltip=[cat, series, alt.Tooltip(f"{value}:Q", format=".3f")])
