"""Compare page: two audits (checkpoints, modes, simulators) or two training runs side by side.

Audits are compared with ``audit.compare.compare_audits`` over their rehearsed steps: the
difference of divergence rates and of each scorer's mean with a trajectory-bootstrap interval and
p-value (paired by trajectory when both audits hold the same trajectories, independent
otherwise), the compounding ratio, and the calls both audits scored. Runs are compared on their
metrics (one chart per chosen key) and config.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, data, ui
from dashboard.readers import read_text
from dashboard.runs import Audit, Run
from dashboard.safe import md
from envace.core.layout import RUN


def all_audits(runs: list[Run]) -> dict[str, Audit]:
    """Every audit under the root: "run/step_N" (training) or the audit directory's name."""
    out = {}
    for r in runs:
        for a in r.audits:
            out[f"{r.name}/{a.label}" if r.kind == "training" else r.name] = a
    return out


def _pick_two(label: str, options: list[str], default_a: int, default_b: int) -> tuple[str, str]:
    left, right = st.columns(2)
    a = left.selectbox(f"{label} A", options, index=default_a, key=f"cmp_{label}_a")
    b = right.selectbox(f"{label} B", options, index=default_b, key=f"cmp_{label}_b")
    return a, b


def _fmt(x: object) -> str:
    return "–" if x is None else (f"{x:.4f}" if isinstance(x, float) else str(x))


def compare_audits(ctx: ui.Context) -> None:
    audits = all_audits(ctx.runs)
    if len(audits) < 2:
        st.info("Comparing needs two audits under the root; this root has "
                f"{len(audits)}.")
        return
    names = list(audits)
    cur = [n for n in names if ctx.run and audits[n].path.is_relative_to(ctx.run.path)]
    a0 = names.index(cur[0]) if cur else 0
    b0 = names.index(cur[-1]) if len(cur) > 1 else (a0 + 1) % len(names)
    a, b = _pick_two("Audit", names, a0, b0)
    if a == b:
        st.warning("Pick two different audits.")
        return
    c = data.compare(audits[a].path, audits[b].path)
    dr = c["divergence_rate"]
    cols = st.columns(3)
    cols[0].metric(f"A · {md(a)}", ui.pct(dr.get("a")), help="divergence rate")
    cols[1].metric(f"B · {md(b)}", ui.pct(dr.get("b")), help="divergence rate")
    cols[2].metric("B − A", "–" if dr.get("diff") is None else f"{dr['diff'] * 100:+.1f} pts",
                   help=f"{dr.get('test') or 'bootstrap'} p = {_fmt(dr.get('p_value'))}")

    def row(figure: str, v: dict) -> dict:
        lo, hi = (v.get("ci") or [None, None])[:2]
        return {"figure": figure, "A": v.get("a"), "B": v.get("b"), "B − A": v.get("diff"),
                "lo": lo, "hi": hi, "p": v.get("p_value"), "significant": v.get("significant")}

    rows = [row("divergence rate", dr)]
    rows += [row(f"mean {name}", v) for name, v in c.get("scores", {}).items()]
    cr = c.get("compounding_ratio") or {}
    rows.append({"figure": "compounding ratio", "A": cr.get("a"), "B": cr.get("b"),
                 "B − A": None, "lo": None, "hi": None, "p": None, "significant": None})
    st.dataframe(pd.DataFrame(rows), hide_index=True)
    unit = c.get("resampling_unit", "trajectory")
    design = (f"paired by trajectory: both audits hold the same trajectories, their {unit} "
              "clusters resampled together" if c.get("design") == "paired_by_trajectory" else
              f"independent: each audit's {unit} clusters resampled on their own")
    iv = c.get("interval") or {}
    tr = c.get("trajectories") or {}
    st.caption(f"Rehearsed steps: A {c['steps']['a']} in {tr.get('a')} trajectories, B "
               f"{c['steps']['b']} in {tr.get('b')}; α = {c.get('alpha')}. Intervals (lo, hi) "
               f"and p: {iv.get('method')}, {iv.get('resamples')} resamples, {design}.")
    for side, pop in (c.get("population") or {}).items():
        if pop == "determinism_check":
            st.warning(f"{side.upper()} holds real responses only: a determinism check, not "
                       "fidelity.")
    if "paired" in c:
        p = c["paired"]
        st.markdown(f"Paired on **{p['pairs']}** identical calls: only A diverged "
                    f"{p['only_a_diverged']}, only B {p['only_b_diverged']}; "
                    f"{p.get('test') or 'bootstrap'} p = {_fmt(p['p_value'])} "
                    f"({'significant' if p.get('significant') else 'not significant'}).")
    _side_by_side(a, audits[a], b, audits[b])


def _side_by_side(a: str, audit_a: Audit, b: str, audit_b: Audit) -> None:
    sa, _ = data.summary(audit_a.path)
    sb, _ = data.summary(audit_b.path)
    if sa is None or sb is None:
        return
    depth, tools = [], []
    for tag, s in (("A", sa), ("B", sb)):
        for r in s.by_depth or []:
            ci = r.divergence_ci or [None, None]
            depth.append({"depth": r.depth, "divergence_rate": r.divergence_rate,
                          "lo": ci[0], "hi": ci[1], "audit": tag})
        for tool, t in (s.by_tool or {}).items():
            tools.append({"tool": tool, "divergence_rate": t.divergence_rate, "audit": tag})
    left, right = st.columns(2)
    if depth:  # a likelihood audit has no divergence by depth (nothing was generated)
        left.altair_chart(charts.band(pd.DataFrame(depth), "depth", "divergence_rate", "lo",
                                      "hi", "Divergence by depth: A vs B", "divergence",
                                      series="audit"), width="stretch")
    else:
        left.info("Neither audit has divergence by depth (a likelihood audit generates nothing "
                  "to compare): see the bits-per-byte comparison.")
    tf = pd.DataFrame(tools)
    both = set(tf[tf.audit == "A"].tool) & set(tf[tf.audit == "B"].tool) if len(tf) else set()
    if both:
        right.altair_chart(charts.grouped_bars(tf[tf.tool.isin(both)], "tool",
                                               "divergence_rate", "audit",
                                               "Divergence by tool: A vs B"), width="stretch")


def _config(run: Run) -> dict[str, str]:
    out = {}
    for line in (read_text(run.path / RUN.config) or "").splitlines():
        if ":" in line and not line.lstrip().startswith("#"):
            k, v = line.split(":", 1)
            out[k.rstrip()] = v.strip()
    return out


def compare_runs(ctx: ui.Context) -> None:
    runs = {r.name: r for r in ctx.runs if r.kind == "training" and r.metrics.is_file()}
    if len(runs) < 2:
        st.info(f"Comparing runs needs two training runs with metrics; this root has "
                f"{len(runs)}.")
        return
    names = list(runs)
    a, b = _pick_two("Run", names, 0, 1)
    fa, fb = data.metrics(runs[a].metrics), data.metrics(runs[b].metrics)
    ui.notes(fa.notes + fb.notes)
    keys = sorted((set(fa.frame.columns) & set(fb.frame.columns)) - {"step", "time"})
    default = [k for k in ("reward/mean", "loss", "fidelity/divergence_rate") if k in keys]
    chosen = st.multiselect("Metrics", keys, default=default or keys[:3], key="cmp_metrics")
    grid = st.columns(2)
    for i, k in enumerate(chosen):
        both = pd.concat([fa.frame[["step", k]].rename(columns={k: f"A · {a}"}),
                          fb.frame[["step", k]].rename(columns={k: f"B · {b}"})])
        with grid[i % 2]:
            st.altair_chart(charts.lines(both, "step", [f"A · {a}", f"B · {b}"], k),
                            width="stretch")
    ca, cb = _config(runs[a]), _config(runs[b])
    diff = [{"key": k, "A": ca.get(k, "–"), "B": cb.get(k, "–")}
            for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)]
    st.markdown("**Config differences**" if diff else "The two configs are identical.")
    if diff:
        st.dataframe(pd.DataFrame(diff), hide_index=True)


ctx = ui.context()
st.title("Compare")
if ctx.problem:
    st.error(ctx.problem)
    st.stop()
mode = st.radio("Compare", ["two audits", "two training runs"], horizontal=True, key="cmp_mode")
with ui.guard("the comparison"):
    (compare_audits if mode == "two audits" else compare_runs)(ctx)
