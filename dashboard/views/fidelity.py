"""Fidelity page: how faithful the rehearsed tool responses are, from an audit's summary.json.

Divergence rate and scores by depth with confidence bands; the first-divergence survival curve
and hazard; the compounding ratio; real vs own history (a probe with ``--history both``); per
tool; read versus write tools; state change (leaves of the real state a call changed: the
cliff); novelty; skill against
reference world models; and, for a training run, fidelity across its audited steps. Every figure
counts rehearsed steps only (depth 0 = a trajectory's first rehearsed step) and its interval
resamples whole trajectories, as the audit computes them; a summary of an older format is
recomputed from its steps (``data.summary``), so the page agrees with ``metrics.jsonl``.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import streamlit as st

from audit.store.models import (
    AuditSummary,
    Cliff,
    Compounding,
    Counts,
    DeepHistory,
    Difference,
    FirstDivergence,
    History,
    Logistic,
    Rate,
    Skill,
    Statistics,
    Stratum,
)
from dashboard import charts, data, ui
from dashboard.likelihood import likelihood
from dashboard.runs import Run
from dashboard.safe import code, md


def strata(table: Mapping[str, Stratum] | None, label: str) -> pd.DataFrame:
    """A ``{label: stratum}`` block of summary.json as a frame with CI columns and score means."""
    rows = []
    for key, r in (table or {}).items():
        lo, hi = (r.divergence_ci or [None, None])[:2]
        row = {label: key, "n": r.n, "diverged": r.diverged,
               "divergence_rate": r.divergence_rate, "lo": lo, "hi": hi}
        for name, v in (r.scores or {}).items():
            row[f"mean {name}"] = v.mean
        rows.append(row)
    return pd.DataFrame(rows)


def scope(s: AuditSummary) -> None:
    """What the figures count, how intervals are made, and warnings about real steps."""
    if s.determinism_check:
        st.warning("Determinism check: this audit holds real responses only (nothing was "
                   "rehearsed), so its figures are the real steps replayed against the "
                   "environment, not fidelity. The divergence rate must be 0.")
    if s.determinism_warning:
        st.error(f"Real responses diverge: {md(s.determinism_warning)}.")
    if s.recomputed_from:
        st.info("This audit's summary.json predates the current statistics (it pooled real "
                "history steps with rehearsed ones); the figures here are recomputed from its "
                "steps.jsonl (the odds-ratio interval is left out). `envace-audit rescore DIR "
                "--out DIR` rewrites it.")


def headline(s: AuditSummary, run: Run, audit_label: str) -> None:
    c = s.counts or Counts()
    comp = s.compounding or Compounding()
    scope(s)
    cols = st.columns(5)
    cols[0].metric("Divergence rate", ui.pct(s.divergence_rate), help=ui.ci(s.divergence_ci))
    cols[1].metric("Real tool calls" if s.determinism_check else "Rehearsed tool calls",
                   s.scored_steps if s.scored_steps is not None else "–",
                   help="the steps every figure counts")
    cols[2].metric("Trajectories", c.trajectories if c.trajectories is not None else "–")
    cols[3].metric("Compounding ratio", ui.num(comp.ratio, 2),
                   help=ui.ci(comp.ci, as_pct=False))
    cols[4].metric("Median first divergence", s.median_first_divergence
                   if s.median_first_divergence is not None else "none")
    verdict = s.verdict
    iv = s.interval
    stats = s.statistics or Statistics()
    unmarked = stats.unmarked_steps_counted_as_rehearsed
    st.caption(f"{md(run.name)} · {md(audit_label)}: divergence "
               f"{ui.pct(s.divergence_rate)} "
               f"{ui.ci(s.divergence_ci)}; diverged = "
               f"{code(verdict.scorer if verdict else None)} < "
               f"{md(verdict.threshold if verdict else None)}; "
               f"{md(c.malformed_calls or 0)} malformed, "
               f"{c.unanswered_steps or 0} unanswered, {c.skipped or 0} records skipped; "
               f"{stats.real_steps_excluded or 0} real history steps left out"
               + (f", {unmarked} unmarked responses counted as rehearsed" if unmarked else "")
               + (f". Intervals: {iv.method} ({iv.resamples} resamples of whole "
                  f"clusters, unit {iv.resampling_unit or 'trajectory'}, seed "
                  f"{iv.seed})." if iv else "."))


def by_depth(s: AuditSummary) -> None:
    rows = s.by_depth or []
    if not rows:
        st.info("No answered steps: nothing to show by depth.")
        return
    df = pd.DataFrame([{"depth": r.depth, "n": r.n, "divergence_rate": r.divergence_rate,
                        "lo": (r.divergence_ci or [None, None])[0],
                        "hi": (r.divergence_ci or [None, None])[1]} for r in rows])
    left, right = st.columns(2)
    left.altair_chart(charts.band(df, "depth", "divergence_rate", "lo", "hi",
                                  "Divergence rate by step depth", "divergence"), width="stretch")
    left.caption("Depth 0 = each trajectory's first rehearsed step.")
    scorers = list(s.scores or {})
    if scorers:
        name = right.selectbox("Score", scorers, key="fid_scorer",
                               index=scorers.index("json_f1") if "json_f1" in scorers else 0)
        sc = pd.DataFrame([{"depth": r.depth, "mean": v.mean, "lo": v.ci[0], "hi": v.ci[1]}
                           for r in rows if (v := (r.scores or {}).get(name)) is not None
                           and v.ci])
        right.altair_chart(charts.band(sc, "depth", "mean", "lo", "hi", f"Mean {name} by depth",
                                       name, percent=False), width="stretch")
    st.dataframe(df, hide_index=True)


def first_divergence(s: AuditSummary) -> None:
    fd = s.first_divergence or FirstDivergence()
    rows = [r.dump() for r in fd.rows or []]
    if not rows:
        st.info("No trajectories: no survival curve.")
        return
    st.write(f"{fd.n_events or 0} of {fd.n_trajectories or 0} trajectories diverge at "
             f"least once; median depth of the first divergence: "
             f"**{fd.median if fd.median is not None else 'not reached'}**.")
    left, right = st.columns(2)
    left.altair_chart(charts.survival(rows), width="stretch")
    right.altair_chart(charts.hazard(rows), width="stretch")
    st.dataframe(pd.DataFrame(rows), hide_index=True)


def compounding(s: AuditSummary) -> None:
    comp = s.compounding or Compounding()
    cols = st.columns(3)
    cols[0].metric("P(div | earlier div) / P(div | none)", ui.num(comp.ratio, 3),
                   help="P(diverge | an earlier divergence) / P(diverge | none)")
    cols[1].metric("P(diverge | earlier divergence)", ui.pct(comp.p_after_divergence))
    cols[2].metric("P(diverge | no earlier divergence)", ui.pct(comp.p_no_prior_divergence))
    st.caption(f"Ratio {ui.ci(comp.ci, as_pct=False)} ({md(comp.ci_method or '')}); "
               f"{comp.n_steps or 0} steps after the first of "
               f"{comp.n_trajectories or 0} trajectories."
               + (f" Note: {md(comp.note)}" if comp.note else ""))
    t = comp.table or {}
    if t:
        st.dataframe(pd.DataFrame(
            {"diverged": [t.get("prior_diverged"), t.get("no_prior_diverged")],
             "matched": [t.get("prior_matched"), t.get("no_prior_matched")]},
            index=["after an earlier divergence", "no earlier divergence"]))
    if comp.by_depth:
        st.altair_chart(charts.conditional([r.dump() for r in comp.by_depth]), width="stretch")
    lg = s.logistic or Logistic()
    if lg.odds_ratio_prior_divergence is not None:
        st.caption(f"Logistic model over {md(', '.join(map(str, lg.features or [])))}: "
                   "odds ratio of a "
                   f"prior divergence {ui.num(lg.odds_ratio_prior_divergence, 2)} "
                   f"{ui.ci(lg.odds_ratio_ci, as_pct=False)}.")


def history_frame(h: History) -> pd.DataFrame:
    """The ``history`` block's by-depth rows as a long frame: depth, history, rate, lo, hi."""
    rows = []
    for r in h.by_depth or []:
        for v, name in ((r.real, "real history"), (r.own, "own history")):
            v = v or Rate()
            lo, hi = (v.ci or [None, None])[:2]
            rows.append({"depth": r.depth, "history": name, "n": r.n,
                         "divergence_rate": v.point, "lo": lo, "hi": hi})
    return pd.DataFrame(rows)


def history(s: AuditSummary) -> None:
    """Real vs own history (``envace probe --history both``): difficulty vs compounding."""
    h = s.history or History()
    o = h.overall
    if not o:
        st.info("This audit probed one history only. `envace probe --history both` rehearses "
                "every call twice, given the real responses and given the model's own "
                "answers, and splits divergence into difficulty and compounding.")
        return
    deep = h.deep or DeepHistory()
    real, own, diff = o.real or Rate(), o.own or Rate(), o.diff or Difference()
    cols = st.columns(4)
    cols[0].metric("Divergence, real history", ui.pct(real.point), help=ui.ci(real.ci))
    cols[1].metric("Divergence, own history", ui.pct(own.point), help=ui.ci(own.ci))
    cols[2].metric("Own − real", ui.pct(diff.diff), help=ui.ci(diff.ci))
    share = deep.compounding_share or Rate()
    cols[3].metric(f"Compounding share, depth ≥ {deep.min_depth}",
                   ui.pct(share.point), help=ui.ci(share.ci))
    st.caption(f"{o.n} calls of {o.trajectories} trajectories, each rehearsed "
               f"twice; induced errors (own wrong, real right): {(o.induced or Rate()).count}, "
               f"recovered (real wrong, own right): {(o.recovered or Rate()).count}. Intervals "
               "resample whole trajectories.")
    df = history_frame(h)
    if not df.empty:
        st.altair_chart(charts.band(df, "depth", "divergence_rate", "lo", "hi",
                                    "The same calls, real vs own history", "divergence",
                                    series="history"), width="stretch")
    st.dataframe(pd.DataFrame([{"depth": r.depth, "calls": r.n,
                                "real": (r.real or Rate()).point, "own": (r.own or Rate()).point,
                                "own − real": (r.diff or Difference()).diff,
                                "induced": (r.induced or Rate()).count}
                               for r in h.by_depth or []]), hide_index=True)


def stratum(s: AuditSummary, key: str, label: str, title: str) -> None:
    df = strata(getattr(s, key), label)
    if df.empty:
        st.info(f"No {title.lower()} in this audit.")
        return
    st.altair_chart(charts.strata_bars(df, label, title), width="stretch")
    st.dataframe(df.sort_values("divergence_rate", ascending=False), hide_index=True)


def skill(s: AuditSummary) -> None:
    sk = (s.skill or Skill()).by_scorer or {}
    if not sk:
        st.info("No reference world models in this audit: run `envace-audit replay ... "
                "--reference train.jsonl` to see skill against a lookup table and the most "
                "common response.")
        return
    rows = [{"scorer": n, "model": v.f_model, "best reference": v.best_reference,
             "reference": v.f_ref, "skill": v.point, "lo": v.lo, "hi": v.hi,
             **{f"ref {k}": x for k, x in (v.reference_means or {}).items()}}
            for n, v in sk.items()]
    st.write("Skill = (F − F_ref) / (1 − F_ref) against the best trivial reference world model.")
    st.dataframe(pd.DataFrame(rows), hide_index=True)
    each = [{"scorer": n, "reference": ref, "reference's score": v.f_ref,
             "skill": v.point, "lo": v.lo, "hi": v.hi}
            for n, row in sk.items() for ref, v in (row.against or {}).items()]
    if each:
        st.write("Skill against each reference (`edit` copies the call's arguments into the most "
                 "similar training response: above `lookup` but below `edit` may be copying only).")
        st.dataframe(pd.DataFrame(each), hide_index=True)


def state_change(s: AuditSummary) -> None:
    """Divergence and skill by how many leaves of the real state the call changed (the
    state-change cliff), and the claims of write calls."""
    block = s.by_state_change
    if block is None or not block.strata:
        st.info("This audit has no state-change record (written before it existed, or with "
                "state tracking off): replay it again to see fidelity by state change.")
        return
    c = block.cliff or Cliff()
    if c.present is None:
        st.write("State-change cliff: not assessable (a stratum has no call).")
    else:
        st.write(("**A state-change cliff**: " if c.present else "No state-change cliff: ")
                 + f"divergence {ui.pct(c.low_rate)} on calls that changed no state "
                 f"leaf, {ui.pct(c.high_rate)} on calls that changed two or more "
                 f"(difference {ui.pct(c.diff)} {ui.ci(c.ci)}).")
    df = strata(block.strata, "leaves changed")
    verdict = s.verdict.scorer if s.verdict is not None else None
    for i, v in enumerate(block.strata.values()):
        sk = v.skill or {}
        one = sk.get(verdict) if verdict in sk else next(iter(sk.values()), None)
        if one is not None:
            df.loc[i, "skill"] = one.point
            df.loc[i, "skill lo"], df.loc[i, "skill hi"] = one.lo, one.hi
        df.loc[i, "writes"] = v.writes
    if not df.empty:
        st.altair_chart(charts.strata_bars(df, "leaves changed", "Divergence by state leaves "
                                           "the real call changed"), width="stretch")
        st.dataframe(df, hide_index=True)
    if block.claims:
        st.write("Responses that claim success where the real call failed, and the reverse:")
        st.dataframe(pd.DataFrame([{"calls of": k, **v} for k, v in block.claims.items()]),
                     hide_index=True)


def counts(s: AuditSummary) -> None:
    shown = s.dump()
    st.json({k: shown.get(k) for k in ("counts", "by_source", "error_prediction", "verdict",
                                       "inputs", "audited_model", "reconciles")},
            expanded=False)
    for w in s.warnings or []:
        st.warning(md(w.model_dump()))
    skipped = [r.row() for r in s.skipped_records or []]
    if skipped:
        st.warning(f"{len(skipped)} record(s) skipped by the audit:")
        st.dataframe(pd.DataFrame(skipped), hide_index=True)


def page(run: Run) -> None:
    audit = ui.pick_audit(run, key="fid_audit")
    if audit is None:
        return
    s, err = data.summary(audit.path)
    if s is None:
        st.warning(f"{md(audit.label)}: {md(err)}. The audit may still be writing; its steps are "
                   "on the "
                   "Trajectories page.")
        return
    headline(s, run, audit.label)
    tabs = ["By depth", "First divergence", "Compounding", "Real vs own history", "By tool",
            "Read vs write", "State change", "Novelty", "Skill", "Likelihood", "Counts"]
    if s.likelihood:  # a likelihood audit: its figures first
        tabs.insert(0, tabs.pop(tabs.index("Likelihood")))
    trend = data.audit_trend(run.audits) if len(run.audits) > 1 else pd.DataFrame()
    if not trend.empty:
        tabs.insert(0, "Over training")
    t = dict(zip(tabs, st.tabs(tabs), strict=True))
    if "Over training" in t:
        with t["Over training"]:
            st.altair_chart(charts.band(trend, "step", "divergence_rate", "lo", "hi",
                                        "Divergence rate per audited training step",
                                        "divergence"), width="stretch")
            st.dataframe(trend, hide_index=True)
    parts = [("By depth", by_depth), ("First divergence", first_divergence),
             ("Compounding", compounding), ("Real vs own history", history), ("Skill", skill),
             ("State change", state_change), ("Likelihood", likelihood), ("Counts", counts)]
    for name, fn in parts:
        with t[name], ui.guard(name.lower()):
            fn(s)
    for name, key, label, title in (
            ("By tool", "by_tool", "tool", "Divergence by tool"),
            ("Read vs write", "by_mutates_state", "kind", "Divergence of read vs write tools"),
            ("Novelty", "by_novelty", "novelty", "Divergence by novelty of the true response")):
        with t[name], ui.guard(name.lower()):
            stratum(s, key, label, title)


ctx, run = ui.require_run()
st.title("Fidelity")
with ui.guard("the fidelity figures"):
    page(run)
