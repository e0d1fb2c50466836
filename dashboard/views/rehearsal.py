"""Test-time rehearsal page: the plans rehearsed privately, the memory, the commit, the outcome.

Reads what ``envace eval --rehearsal parallel|sequential`` writes
(``envace/evaluation/rehearsal_eval.py``), in a training run's ``eval/<name>/`` or standing alone:
``trajectories.jsonl`` (records whose
``meta.plan`` is "rehearsal_<i>" or "commit"; the commit carries ``meta.memory``,
``meta.success`` and ``meta.budget``), ``summary.json`` (success with its interval, budget,
rehearsal audit, fidelity vs success), and ``audit/`` (the plans' rehearsed responses replayed
for real) to say how realistic each plan's imagined responses were. Names and texts from the
files are shown as text (``dashboard.safe``), never as markdown.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import conversation, data, ui
from dashboard.runs import Run, is_audit_dir
from dashboard.safe import md
from envace.core.layout import AUDIT, RUN

NONE_MSG = ("No rehearsal evaluations in this run: test-time rehearsal results appear under "
            "`eval/<name>/` (`envace eval --rehearsal parallel|sequential`), as trajectories "
            "whose `meta.plan` is `rehearsal_<i>` or `commit`.")


def plans_of(eval_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Trajectory records with ``meta.plan`` from the JSONL files of an eval directory
    (``trajectories.jsonl`` first; a record repeated in ``plans.jsonl`` is kept once)."""
    records, notes, seen = [], [], set()
    files = sorted(eval_dir.glob("*.jsonl"), key=lambda f: (f.name != RUN.eval_trajectories,
                                                            f.name))
    for f in files:
        got = data.jsonl(f)
        notes += got.notes(f.name)
        for r in got.records:
            if (isinstance(r.get("messages"), list) and isinstance(r.get("meta"), dict)
                    and r["meta"].get("plan") and r.get("id") not in seen):
                seen.add(r.get("id"))
                records.append(r)
    return records, notes


def succeeded(commit: dict[str, Any]) -> bool:
    """The verifier's verdict (``meta.success``), else a positive reward."""
    ok = commit["meta"].get("success")
    return bool(ok) if ok is not None else (commit.get("reward") or 0) > 0


def headline(summ: dict[str, Any]) -> None:
    """Success with its interval, attempts, strategy, rehearsal fidelity, fidelity vs success."""
    ra = summ.get("rehearsal_audit") or {}
    fs = summ.get("fidelity_vs_success") or {}
    cols = st.columns(5)
    cols[0].metric("Success rate", ui.pct(summ.get("success_rate")),
                   help=ui.ci(summ.get("success_ci")))
    cols[1].metric("Attempts", summ.get("attempts", summ.get("tasks", "–")))
    cols[2].metric(f"Strategy (n={md(summ.get('n', '–'))})", str(summ.get("strategy", "–")))
    cols[3].metric("Rehearsal divergence", ui.pct(ra.get("divergence_rate")),
                   help=f"{md(ra.get('steps', '–'))} rehearsed responses replayed for real")
    cols[4].metric("Fidelity ↔ success (r)", ui.num(fs.get("point_biserial_r"), 2),
                   help=md(fs.get("note")) if fs.get("note") else
                   f"p = {ui.num(_float(fs.get('p_value')))}")
    budget = summ.get("budget") or {}
    if budget:
        st.caption("Mean budget per attempt: " + ", ".join(
            f"{md(str(k).replace('_', ' '))} {v:.4g}" for k, v in budget.items()
            if isinstance(v, int | float)))


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def eval_audit(eval_dir: Path) -> Path | None:
    for d in (eval_dir / RUN.audit, eval_dir):
        if (d / AUDIT.steps).is_file() and is_audit_dir(d):
            return d
    return None


def _group(r: dict[str, Any]) -> str:
    seed = r["meta"].get("seed", r["meta"].get("episode"))
    return str(r.get("task_id")) + (f" · seed {seed}" if seed is not None else "")


def _calls(r: dict[str, Any]) -> list[str]:
    return [conversation.call_text((c.get("function") or {}).get("name", "?"),
                                   (c.get("function") or {}).get("arguments"))
            for m in r.get("messages", []) for c in (m.get("tool_calls") or [])]


def fidelity(audit_dir: Path | None) -> pd.DataFrame:
    if audit_dir is None:
        return pd.DataFrame()
    s = data.steps(audit_dir).frame
    if s.empty:
        return pd.DataFrame()
    # rehearsed steps only: a plan of a per-turn task carries earlier turns as real history
    s = s[~s["source_rehearsed"].eq(False) & ~s["unanswered"]]
    g = s.groupby("trajectory_id", observed=True)
    return pd.DataFrame({"calls": g.size(), "diverged": g["diverged"].sum()})


def overview(groups: dict[str, list[dict]], fid: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for key, recs in groups.items():
        plans = [r for r in recs if r["meta"]["plan"] != "commit"]
        commit = next((r for r in recs if r["meta"]["plan"] == "commit"), None)
        div = [int(fid.loc[r["id"], "diverged"]) for r in plans if r["id"] in fid.index]
        calls = [int(fid.loc[r["id"], "calls"]) for r in plans if r["id"] in fid.index]
        rows.append({"task": key, "plans": len(plans),
                     "plan rewards": ", ".join(f"{r.get('reward')}" for r in plans),
                     "rehearsal divergence": ui.pct(sum(div) / sum(calls)) if sum(calls) else "–",
                     "commit reward": commit.get("reward") if commit else None,
                     "outcome": "–" if not commit else ("success" if succeeded(commit)
                                                       else "failure")})
    return pd.DataFrame(rows)


def show_task(recs: list[dict], fid: pd.DataFrame, audit_dir: Path | None) -> None:
    plans = sorted((r for r in recs if r["meta"]["plan"] != "commit"),
                   key=lambda r: r["meta"]["plan"])
    commit = next((r for r in recs if r["meta"]["plan"] == "commit"), None)
    st.markdown(f"#### Rehearsed plans ({len(plans)})")
    cols = st.columns(max(1, len(plans)))
    for col, p in zip(cols, plans, strict=False):
        with col, st.container(border=True):
            st.markdown(f"**{md(p['meta']['plan'])}** · imagined reward {md(p.get('reward'))}")
            if p["id"] in fid.index:
                k, n = int(fid.loc[p["id"], "diverged"]), int(fid.loc[p["id"], "calls"])
                st.caption(f"{k} of {n} rehearsed responses diverge from reality")
            st.code("\n".join(_calls(p)) or "(no calls)", language="python")
            if p["meta"].get("critique"):
                st.caption("Self-critique:")
                st.text(str(p["meta"]["critique"]))
    if audit_dir is not None and plans:
        pick = st.selectbox("Rehearsed responses vs reality, for plan",
                            [p["meta"]["plan"] for p in plans], key="rh_plan")
        chosen = next(p for p in plans if p["meta"]["plan"] == pick)
        s = data.steps(audit_dir).frame
        rows = s[s["trajectory_id"] == chosen["id"]].sort_values("step")
        recs_ = data.step_texts(audit_dir, rows["offset"].tolist())
        steps = {int(r["step"]): r for r in recs_ if "step" in r}
        first = min((k for k, r in steps.items() if r.get("diverged")), default=None)
        with st.expander(f"{md(pick)}: {len(steps)} audited calls", expanded=False):
            conversation.render_steps_only(steps, first)
    st.markdown("#### Rehearsal memory")
    memory = (commit or {}).get("meta", {}).get("memory")
    st.code(memory if memory else "(no memory recorded)", language=None)
    dropped = (commit or {}).get("meta", {}).get("memory_dropped")
    if dropped:
        st.caption(f"{md(dropped)} earlier plan(s) were dropped to fit the context.")
    st.markdown("#### Committed run")
    if commit is None:
        st.warning("No committed run recorded for this task.")
        return
    reward = commit.get("reward")
    if succeeded(commit):
        st.success(f"Outcome: success (reward {md(reward)})")
    else:
        st.error(f"Outcome: failure (reward {md(reward)})")
    st.code("\n".join(_calls(commit)) or "(no calls)", language="python")
    budget = commit["meta"].get("budget")
    if budget:
        st.caption("Budget: " + md(json.dumps(budget)))


def page(run: Run) -> None:
    found, plain = {}, []
    for d in run.evals:
        recs, notes = plans_of(d)
        if any(r["meta"]["plan"] != "commit" for r in recs):
            found["." if d == run.path else d.name] = (d, recs, notes)
        elif recs:
            plain.append(d.name)
    if plain:
        st.caption(f"Evaluations without rehearsal (commits only): {md(', '.join(plain))}.")
    if not found:
        st.info(NONE_MSG)
        return
    name = st.selectbox("Evaluation", list(found), key="rh_eval")
    d, recs, notes = found[name]
    ui.notes(notes)
    summ, err = data.json_file(d / RUN.eval_summary)
    if summ:
        headline(summ)
        with st.expander(RUN.eval_summary):
            st.json(summ)
    else:
        st.warning(md(err))
    audit_dir = eval_audit(d)
    fid = fidelity(audit_dir)
    groups: dict[str, list[dict]] = {}
    for r in recs:
        groups.setdefault(_group(r), []).append(r)
    st.dataframe(overview(groups, fid), hide_index=True)
    key = st.selectbox("Task", list(groups), key="rh_task")
    show_task(groups[key], fid, audit_dir)


ctx, run = ui.require_run()
st.title("Test-time rehearsal")
with ui.guard("the rehearsal evaluations"):
    page(run)
