"""``report.md`` and its PNG plots, for a person, from an audit's ``summary.json``.

Plots: divergence rate by depth with 95 % intervals (``depth.png``), first-divergence survival
(``survival.png``), divergence by tool (``tools.png``). matplotlib's Agg backend; no display.
The report says which steps the statistics count (rehearsed only, or a determinism check) and
how intervals are computed, and warns when a real response diverges.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from audit.stats.state_change import report_lines
from audit.store.models import place
from envace.core.layout import AUDIT
from envace.core.text import markdown_safe as md
from envace.core.text import terminal_safe


def _fmt(x: Any, pct: bool = False) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.1%}" if pct else f"{x:.3f}"
    return str(x)


def _ci(ci: Any, pct: bool = True) -> str:
    if not ci or ci[0] is None:
        return ""
    return f" [{_fmt(ci[0], pct)}, {_fmt(ci[1], pct)}]"


def _save(fig: Any, out: Path, name: str) -> str:
    """Write a finished figure as ``out/name`` and close it; return ``name``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def plot_all(out: Path, s: dict[str, Any], notes: list[str] | None = None) -> list[str]:
    """The figures of summary ``s`` written into ``out`` (their names). What matplotlib warns
    of while drawing (a glyph of a tool name missing from the font, ...) never reaches the
    terminal raw: each distinct message, made safe, goes to ``notes`` (report.md shows them)."""
    import logging
    import warnings

    caught: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            caught.append(record.getMessage())

    log = logging.getLogger("matplotlib")
    keep, propagate = _Keep(logging.WARNING), log.propagate
    log.addHandler(keep)
    log.propagate = False
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            made = _plot_all(out, s)
        caught.extend(str(w.message) for w in seen)
    finally:
        log.removeHandler(keep)
        log.propagate = propagate
    if notes is not None:
        notes.extend(terminal_safe(m)[:300] for m in dict.fromkeys(caught))
    return made


def _plot_all(out: Path, s: dict[str, Any]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    rows = s.get("by_depth") or []
    if rows:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        d = [r["depth"] for r in rows]
        rate = [r["divergence_rate"] for r in rows]
        lo = [r["divergence_ci"][0] for r in rows]
        hi = [r["divergence_ci"][1] for r in rows]
        ax.fill_between(d, lo, hi, alpha=0.25)
        ax.plot(d, rate, marker="o")
        ax.set(xlabel="depth (0 = first rehearsed step)", ylabel="divergence rate", ylim=(0, 1),
               title="Divergence by depth (95% trajectory-bootstrap CI)")
        made.append(_save(fig, out, AUDIT.depth_plot))
    km = (s.get("first_divergence") or {}).get("rows") or []
    if km:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.step([-1] + [r["depth"] for r in km], [1.0] + [r["survival"] for r in km], where="post")
        ax.set(xlabel="depth (0 = first rehearsed step)", ylabel="P(no divergence yet)",
               ylim=(0, 1.02),
               title="First-divergence survival (Kaplan–Meier)")
        made.append(_save(fig, out, AUDIT.survival_plot))
    tools = s.get("by_tool") or {}
    if tools:
        items = sorted(tools.items(), key=lambda kv: -kv[1]["n"])[:20]
        fig, ax = plt.subplots(figsize=(6, 0.25 * len(items) + 1.2))
        # names are data: controls made visible, "$" kept from starting mathtext
        labels = [terminal_safe(k).replace("$", r"\$") for k, _ in items]
        ax.barh(range(len(items)), [v["divergence_rate"] for _, v in items],
                tick_label=labels)
        ax.invert_yaxis()
        ax.set(xlabel="divergence rate", xlim=(0, 1), title="Divergence by tool (most used)")
        made.append(_save(fig, out, AUDIT.tools_plot))
    hist = (s.get("history") or {}).get("by_depth") or []
    if hist:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        d = [r["depth"] for r in hist]
        for key, label in (("real", "real history (difficulty)"),
                           ("own", "own history (difficulty + compounding)")):
            rate = [r[key]["point"] for r in hist]
            lo = [(r[key]["ci"] or [p, p])[0] for r, p in zip(hist, rate, strict=True)]
            hi = [(r[key]["ci"] or [p, p])[1] for r, p in zip(hist, rate, strict=True)]
            ax.fill_between(d, lo, hi, alpha=0.2)
            ax.plot(d, rate, marker="o", label=label)
        ax.set(xlabel="depth (0 = first probed call)", ylabel="divergence rate", ylim=(0, 1),
               title="The same calls, real vs own history (95% CI)")
        ax.legend(fontsize=8)
        made.append(_save(fig, out, AUDIT.history_plot))
    return made


def _pct_ci(v: dict[str, Any] | None) -> str:
    v = v or {}
    return f"{_fmt(v.get('point'), True)}{_ci(v.get('ci'))}"


def history_lines(h: dict[str, Any]) -> list[str]:
    """The report's section on the real-vs-own decomposition (probe ``--history both``)."""
    o, deep = h.get("overall") or {}, h.get("deep") or {}
    if not o:
        return []
    share, dshare = h.get("compounding_share") or {}, deep.get("compounding_share") or {}
    lines = ["", "## Real vs own history (error compounding, isolated)", "",
             "The same ground-truth calls rehearsed given the real responses of earlier calls "
             "and given the model's own earlier answers; paired by step. What the real history "
             "already shows is difficulty; own − real is what its own history costs: the "
             "figure that answers *do a model's own errors cause later ones?* (the "
             "compounding ratio and the depth trend above do not).", "",
             f"- divergence with the real history {_pct_ci(o.get('real'))}, with its own "
             f"{_pct_ci(o.get('own'))}; own − real {_fmt(o['diff'].get('diff'), True)}"
             f"{_ci(o['diff'].get('ci'))} over {o.get('n')} calls",
             f"- induced (own diverged, real right): {o['induced'].get('count')} = "
             f"{_pct_ci(o.get('induced'))} of own-history divergences; recovered (real "
             f"diverged, own right): {o['recovered'].get('count')} = "
             f"{_pct_ci(o.get('recovered'))} of real-history divergences",
             f"- compounding share (own − real) / own: {_pct_ci(share)} overall, "
             f"{_pct_ci(dshare)} at depth ≥ {deep.get('min_depth')} ({deep.get('n', 0)} calls)",
             "", "| depth | calls | real | own | own − real | 95% CI | induced |",
             "|---|---|---|---|---|---|---|"]
    for r in h.get("by_depth") or []:
        lines.append(f"| {r['depth']} | {r['n']} | {_fmt(r['real']['point'], True)} | "
                     f"{_fmt(r['own']['point'], True)} | {_fmt(r['diff']['diff'], True)} |"
                     f"{_ci(r['diff']['ci'])} | {r['induced']['count']} |")
    for key, title in (("by_mutates_state", "read/write"), ("by_novelty", "novelty")):
        for k, v in (h.get(key) or {}).items():
            lines.append(f"| {title}: {k} | {v['n']} | {_fmt(v['real']['point'], True)} | "
                         f"{_fmt(v['own']['point'], True)} | {_fmt(v['diff']['diff'], True)} |"
                         f"{_ci(v['diff']['ci'])} | {v['induced']['count']} |")
    return lines


def _scope(s: dict[str, Any]) -> list[str]:
    """Which steps the figures count, how intervals are made, and determinism warnings."""
    st = s.get("statistics") or {}
    iv = s.get("interval") or {}
    out = []
    if s.get("determinism_check"):
        out += ["**Determinism check.** This file holds real responses only (no rehearsed "
                "step): the figures below are the real steps replayed against the environment, "
                "not fidelity, and the divergence rate must be 0.", ""]
    elif st:
        unmarked = st.get("unmarked_steps_counted_as_rehearsed") or 0
        out += [f"Statistics over the {st.get('steps')} answered rehearsed steps of "
                f"{st.get('trajectories')} trajectories, depth 0 = each trajectory's first "
                f"rehearsed step; {st.get('real_steps_excluded', 0)} real history steps are "
                "left out (the determinism check under *By who wrote the response*)"
                + (f"; {unmarked} responses without a `rehearsed` flag counted as rehearsed"
                   if unmarked else "") + ".", ""]
    if iv:
        unit = iv.get("resampling_unit") or s.get("resampling_unit") or "trajectory"
        err = s.get("divergence_ci_mc_error")
        out += [f"Intervals: {iv.get('level', 0.95):.0%}, {iv.get('method')} "
                f"({iv.get('resamples')} resamples of whole clusters, unit: **{unit}**"
                + (f", {iv['clusters']} clusters" if iv.get("clusters") is not None else "")
                + f", seed {iv.get('seed')}); where the resamples have no spread, Wilson's "
                "interval on the number of clusters. Monte-Carlo error of the interval ends "
                "(`mc_error`, from the order statistics of the replicates): "
                + (f"{err:.3f} for the divergence rate's" if isinstance(err, float)
                   else "in the summary") + "; it is not below the printed precision, so the "
                "third decimal of an interval end moves with the seed.", ""]
    if s.get("determinism_warning"):
        out += [f"**Warning:** {md(s['determinism_warning'])}.", ""]
    return out


def _headline(s: dict[str, Any]) -> list[str]:
    """Title, inputs, verdict, scope and the counts that reconcile."""
    c = s["counts"]
    return [
        "# Fidelity audit" + (" — determinism check" if s.get("determinism_check") else ""),
        "",
        f"Inputs: {', '.join(md(i) for i in s['inputs'])}",
        f"Verdict: diverged = `{s['verdict']['scorer']}` < {s['verdict']['threshold']}",
        "",
        *_scope(s),
        f"- records read: {c['records_read']} = audited {c['trajectories']} + skipped "
        f"{c['skipped']} ({'reconciles' if s['reconciles'] else 'DOES NOT reconcile'})",
        f"- tool calls: {c['steps']} (answered {c['answered_steps']}, unanswered "
        f"{c['unanswered_steps']}, malformed {c['malformed_calls']})",
        f"- **divergence rate"
        f"{' of the real steps' if s.get('determinism_check') else ''}: "
        f"{_fmt(s.get('divergence_rate'), True)}{_ci(s.get('divergence_ci'))}**"
        + (f" over {c['scored_steps']} steps" if "scored_steps" in c else ""),
        f"- median first divergence (depth): {_fmt(s.get('median_first_divergence'))}",
    ]


def _compounding_lines(s: dict[str, Any]) -> list[str]:
    """The compounding ratio, the depth trend, the logistic odds ratio and error prediction,
    each with the question it answers."""
    lines: list[str] = []
    comp = s.get("compounding") or {}
    lines.append(f"- compounding ratio P(div | earlier div) / P(div | none): "
                 f"{_fmt(comp.get('ratio'))}{_ci(comp.get('ci'), False)}"
                 + (f" ({comp['note']})" if comp.get("note") else "")
                 + " — answers *are later errors associated with earlier ones?* (association "
                 "only: harder trajectories alone push it above 1)")
    trend = comp.get("depth_trend")
    if trend:
        lines.append(f"- depth trend, odds ratio of divergence per depth (logistic, "
                     f"cluster-robust): {_fmt(trend.get('odds_ratio_per_depth'))}"
                     f"{_ci(trend.get('ci'), False)}"
                     + (f" ({trend['note']})" if trend.get("note") else "")
                     + " — answers *do errors grow with depth?*")
    lines.append("- *do a model's own errors cause later ones?* only own − real history "
                 "answers that (`envace probe --history both`"
                 + ("; below" if s.get("history") else "") + ")")
    lg = s.get("logistic") or {}
    lines.append(f"- odds ratio of a prior divergence (logistic): "
                 f"{_fmt(lg.get('odds_ratio_prior_divergence'))}"
                 f"{_ci(lg.get('odds_ratio_ci'), False)}")
    ep = s.get("error_prediction") or {}
    lines.append(f"- real failures: {ep.get('actual_errors')}, predicted by the rehearsal: "
                 f"recall {_fmt(ep.get('recall'), True)}, "
                 f"precision {_fmt(ep.get('precision'), True)}")
    return lines


def _score_lines(s: dict[str, Any]) -> list[str]:
    """The scores table and skill against the reference world models."""
    lines: list[str] = []
    lines += ["", "## Scores", "", "| scorer | mean | 95% CI |", "|---|---|---|"]
    for name, v in (s.get("scores") or {}).items():
        lines.append(f"| {name} | {_fmt(v['mean'])} | {_ci(v.get('ci'), False)} |")
    sk = (s.get("skill") or {}).get("by_scorer") or {}
    if sk:
        lines += ["", "## Skill against reference world models", "",
                  "skill = (F − F_ref) / (1 − F_ref) against the best reference per scorer.", "",
                  "| scorer | model | best reference | reference | skill | 95% CI |",
                  "|---|---|---|---|---|---|"]
        for name, v in sk.items():
            lines.append(f"| {name} | {_fmt(v['f_model'])} | {v['best_reference']} | "
                         f"{_fmt(v['f_ref'])} | {_fmt(v['point'])} | "
                         f"{_ci([v['lo'], v['hi']], False)} |")
        verdict = (s.get("verdict") or {}).get("scorer")
        verdict = verdict if verdict in sk else next(iter(sk))
        against = sk[verdict].get("against") or {}
        if against:
            lines += ["", f"Skill ({verdict}) against each reference world model:", "",
                      "| reference | reference's score | skill | 95% CI |", "|---|---|---|---|"]
            for ref, v in sorted(against.items(), key=lambda kv: -(kv[1].get("f_ref") or 0)):
                lines.append(f"| {ref} | {_fmt(v.get('f_ref'))} | {_fmt(v.get('point'))} | "
                             f"{_ci([v.get('lo'), v.get('hi')], False)} |")
        strata = [(title, b) for key, title in (("by_mutates_state", "tool"),
                                                ("by_novelty", "novelty"))
                  for b in ((s["skill"].get(key) or {}).get(verdict) or {}).items()]
        if strata:
            lines += ["", f"Skill ({verdict}) by read/write tool and by novelty (does it only "
                      "win where it can copy?):", "",
                      "| stratum | steps | model | reference | skill | 95% CI |",
                      "|---|---|---|---|---|---|"]
            for title, (k, v) in strata:
                lines.append(f"| {title} {k} | {v['n']} | {_fmt(v['f_model'])} | "
                             f"{_fmt(v['f_ref'])} | {_fmt(v['point'])} | "
                             f"{_ci([v['lo'], v['hi']], False)} |")
    return lines


def _table_lines(s: dict[str, Any]) -> list[str]:
    """Divergence by who wrote the response, by depth, by read/write, by novelty and by tool."""
    lines: list[str] = []
    src = s.get("by_source") or {}
    if src:
        lines += ["", "## By who wrote the response", "",
                  "Real responses are the determinism check: they must never diverge.", "",
                  "| source | steps | divergence | 95% CI |", "|---|---|---|---|"]
        for k, v in src.items():
            lines.append(f"| {md(k)} | {v['steps']} | {_fmt(v['divergence_rate'], True)} |"
                         f"{_ci(v.get('divergence_ci'))} |")
    lines += ["", "## By depth (0 = first rehearsed step)", "",
              "| depth | steps | divergence | 95% CI |", "|---|---|---|---|"]
    for r in s.get("by_depth") or []:
        lines.append(f"| {r['depth']} | {r['n']} | {_fmt(r['divergence_rate'], True)} |"
                     f"{_ci(r['divergence_ci'])} |")
    for key, title in (("by_mutates_state", "By read/write tool"), ("by_novelty", "By novelty")):
        lines += ["", f"## {title}", "", "| stratum | steps | divergence |", "|---|---|---|"]
        for k, v in (s.get(key) or {}).items():
            lines.append(f"| {md(k)} | {v['n']} | {_fmt(v['divergence_rate'], True)} |")
    lines += ["", "## By tool", "", "| tool | steps | divergence |", "|---|---|---|"]
    for k, v in sorted((s.get("by_tool") or {}).items(), key=lambda kv: -kv[1]["n"]):
        lines.append(f"| {md(k)} | {v['n']} | {_fmt(v['divergence_rate'], True)} |")
    return lines


def _note_lines(s: dict[str, Any]) -> list[str]:
    """Skipped records and warnings (the first 50 of each)."""
    lines: list[str] = []
    if s.get("skipped_records"):
        lines += ["", "## Skipped records", ""]
        for r in s["skipped_records"][:50]:
            lines.append(f"- {md(place(r))}: {md(r['reason'])}")
    if s.get("warnings"):
        lines += ["", "## Warnings", ""]
        for w in s["warnings"][:50]:
            lines.append(f"- {md(place(w))} ({md(w['trajectory_id'])}): "
                         f"{md(w['message'])}")
    return lines


def render_markdown(s: dict[str, Any], plots: list[str]) -> str:
    """``report.md`` of a summary (as written) and its plot files."""
    lines = [*_headline(s), *_compounding_lines(s), *_score_lines(s), *_table_lines(s),
             *history_lines(s.get("history") or {}),
             *report_lines(s.get("by_state_change"), (s.get("verdict") or {}).get("scorer")),
             *_note_lines(s)]
    lines += [""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def write_report(out: Path, summary: dict[str, Any], plots: bool = True) -> None:
    notes: list[str] = []
    made = plot_all(out, summary, notes) if plots else []
    text = render_markdown(summary, made)
    if notes:  # what matplotlib warned of while drawing (missing glyphs, ...), made safe
        text += ("\nNotes on the plots (the tables above give every name exactly):\n\n"
                 + "".join(f"- {md(n)}\n" for n in notes[:20]))
    tmp = out / f"{AUDIT.report}.tmp"
    tmp.write_text(text, encoding="utf-8", errors="backslashreplace")
    os.replace(tmp, out / AUDIT.report)
