"""Trajectories page: filter audited trajectories, then read one as a conversation.

Filters: task, tool, diverged, depth (a trajectory is listed when one of its steps passes all of
them). The trajectory is shown with each rehearsed response beside the actual one (JSON-aware
diff), its first divergence marked, and its calls aligned with ``difflib`` against a reference
trajectory of the same task (by default a real one from another audit under the root), so an
inserted or skipped call shows as such. Ids, names and texts from the files are shown as text
(``dashboard.safe``), never as markdown.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import align, conversation, data, ui
from dashboard.runs import Audit, OutsideRoot, Run, audit_source_file, discover
from dashboard.safe import code, md


def filters(steps: pd.DataFrame) -> pd.DataFrame:
    """The filter widgets; returns the steps that pass them."""
    c1, c2, c3, c4 = st.columns([3, 3, 2, 3])
    tasks = c1.multiselect("Task", sorted(steps["task_id"].unique()), key="tr_tasks")
    tools = c2.multiselect("Tool", sorted(steps["tool"].unique()), key="tr_tools")
    div = c3.selectbox("Diverged", ["any", "diverged", "matched"], key="tr_div")
    lo, hi = int(steps["step"].min()), int(steps["step"].max())
    depth = c4.slider("Depth", lo, max(hi, lo + 1), (lo, max(hi, lo + 1)), key="tr_depth")
    mask = steps["step"].between(depth[0], depth[1])
    if tasks:
        mask &= steps["task_id"].isin(tasks)
    if tools:
        mask &= steps["tool"].isin(tools)
    if div != "any":
        mask &= steps["diverged"] == (div == "diverged")
    return steps[mask]


def references(ctx_root: Path, run: Run, audit: Audit, task: str) -> dict[str, tuple[Audit, str]]:
    """Other audits under the root holding a trajectory of ``task``: label -> (audit, id).

    The task's real trajectory (its ground truth, audited as itself) comes first."""
    found: list[tuple[int, str, Audit, str]] = []
    for r in discover(ctx_root):
        for a in r.audits:
            if a.path == audit.path:
                continue
            t = data.trajectories(a.path).frame
            if t.empty or "task_id" not in t:
                continue
            hit = t[t["task_id"] == task]
            if hit.empty:
                continue
            row = hit.iloc[0]
            real = str(row.get("source", "")) == "real"
            summ, _ = data.summary(a.path)
            stand_in = bool(summ and summ.audited_model)  # a reference model's guesses
            rank = 0 if real and not stand_in else (1 if real else 2)
            lab = f"{r.name}/{a.label}" if r.kind == "training" else r.name
            found.append((rank, f"{lab} · {row['trajectory_id']}" + (" (real)" if rank == 0
                                                                     else ""),
                          a, str(row["trajectory_id"])))
    found.sort(key=lambda x: (x[0], x[1]))
    return {lab: (a, tid) for _, lab, a, tid in found}


def _records(audit: Audit, steps: pd.DataFrame, tid: str) -> dict[int, dict]:
    rows = steps[steps["trajectory_id"] == tid].sort_values("step")
    recs = data.step_texts(audit.path, rows["offset"].tolist())
    return {int(r.get("step", i)): r for i, r in enumerate(recs)}


def alignment(ctx_root: Path, run: Run, audit: Audit, task: str,
              recs: dict[int, dict]) -> tuple[dict[int, str], dict[int, str]]:
    """Pick a reference trajectory and align calls.

    Returns (step -> op for the badges, step -> the reference's calls this trajectory skips
    right after that step; key -1: before its first step).
    """
    refs = references(ctx_root, run, audit, task)
    if not refs:
        st.caption("No other trajectory of this task under the root to align against.")
        return {}, {}
    choice = st.selectbox("Align calls against", ["(none)", *refs], index=1, key="tr_ref")
    if choice == "(none)":
        return {}, {}
    ref_audit, ref_id = refs[choice]
    ref_steps = data.steps(ref_audit.path).frame
    ref = _records(ref_audit, ref_steps, ref_id)
    left = [(recs[k].get("tool", "?"), recs[k].get("arguments")) for k in sorted(recs)]
    right = [(ref[k].get("tool", "?"), ref[k].get("arguments")) for k in sorted(ref)]
    rows = align.align_calls(left, right)
    counts = align.summarize(rows)
    st.markdown(f"Aligned with difflib against **{md(choice)}**: {counts['same']} same, "
                f"{counts['arguments differ']} with other arguments, {counts['inserted']} "
                f"inserted, {counts['skipped']} skipped.")
    lk, rk = sorted(recs), sorted(ref)
    table = pd.DataFrame([{
        "this step": lk[r.left] if r.left is not None else None,
        "this call": conversation.call_text(*left[r.left]) if r.left is not None else "",
        "alignment": r.op,
        "reference call": conversation.call_text(*right[r.right]) if r.right is not None else "",
        "reference step": rk[r.right] if r.right is not None else None} for r in rows])
    with st.expander("Call alignment", expanded=counts["inserted"] + counts["skipped"] > 0):
        st.dataframe(table, hide_index=True)
    ops: dict[int, str] = {}
    skips: dict[int, str] = {}
    last = -1
    for r in rows:  # a skipped call is noted after the step that precedes it
        if r.left is not None:
            last = lk[r.left]
            ops[last] = r.op
        else:
            skips[last] = skips.get(last, "") + conversation.call_text(*right[r.right]) + "\n"
    return ops, skips


def show(ctx_root: Path, run: Run, audit: Audit, steps: pd.DataFrame, trajs: pd.DataFrame,
         tid: str) -> None:
    recs = _records(audit, steps, tid)
    hit = trajs[trajs["trajectory_id"].astype(str) == tid] if "trajectory_id" in trajs else trajs
    row = hit.iloc[0] if len(hit) else None  # absent when trajectories.jsonl lags steps.jsonl
    first = None
    if row is not None and pd.notna(row.get("first_divergence")):
        first = int(row["first_divergence"])
    task = str(row["task_id"]) if row is not None else str(next(iter(recs.values()))["task_id"])
    n_div = sum(bool(r.get("diverged")) for r in recs.values())
    reward = row.get("reward") if row is not None else None
    st.subheader(md(tid))
    st.markdown(f"Task {code(task)} · {len(recs)} calls · {n_div} diverged · first divergence at "
                f"**{'step ' + str(first) if first is not None else 'none'}**"
                + (f" · reward {md(reward)}" if reward is not None and pd.notna(reward) else ""))
    ops, skips = alignment(ctx_root, run, audit, task, recs)
    traj = None
    if row is not None and pd.notna(row.get("line")):
        try:
            path = audit_source_file(ctx_root, run, audit, row.get("file"))
        except OutsideRoot as exc:
            st.warning(f"Not reading the conversation: {md(exc)}. Showing the audited calls "
                       "only.")
            path = None
        if path is not None:
            traj = data.trajectory_record(path, int(row["line"]))
            if traj is not None and traj.get("id") != tid:
                st.warning(f"Line {int(row['line'])} of {md(path.name)} is not {md(tid)} (the "
                           "file changed since the audit); showing the audited calls only.")
                traj = None
        elif path is None and row.get("file"):
            st.caption(f"The trajectory file {md(row.get('file'))} is not at hand: showing the "
                       "audited calls without the conversation.")
    if traj is not None:
        conversation.render_conversation(traj, recs, first, ops, skips)
    else:
        conversation.render_steps_only(recs, first, ops, skips)


def page(ctx_root: Path, run: Run) -> None:
    audit = ui.pick_audit(run, key="tr_audit")
    if audit is None:
        return
    got = data.steps(audit.path)
    ui.notes(got.notes)
    steps = got.frame
    if steps.empty:
        st.info(f"{md(audit.label)}: no audited steps yet (steps.jsonl is empty or absent).")
        return
    tgot = data.trajectories(audit.path)
    ui.notes(tgot.notes)
    trajs = tgot.frame if not tgot.frame.empty else data.from_steps(steps)
    passed = filters(steps)
    ids = list(dict.fromkeys(passed["trajectory_id"].astype(str)))
    st.caption(f"{len(passed)} of {len(steps)} steps match, in {len(ids)} of "
               f"{steps['trajectory_id'].nunique()} trajectories.")
    if not ids:
        st.info("No trajectory matches these filters.")
        return
    listed = trajs[trajs["trajectory_id"].astype(str).isin(ids)]
    cols = [c for c in ("trajectory_id", "task_id", "source", "reward", "steps", "diverged",
                        "first_divergence") if c in listed]
    st.dataframe(listed[cols], hide_index=True, height=min(300, 40 + 35 * len(listed)))
    wanted = st.query_params.get("traj")
    if wanted in ids and st.session_state.get("_url_traj") != wanted:
        st.session_state.tr_traj = wanted
    st.session_state._url_traj = wanted
    if st.session_state.get("tr_traj") not in ids:
        st.session_state.tr_traj = ids[0]
    tid = st.selectbox("Trajectory", ids, key="tr_traj")
    show(ctx_root, run, audit, steps, trajs, tid)


ctx, run = ui.require_run()
st.title("Trajectories")
with ui.guard("the trajectories"):
    page(ctx.root.resolve(), run)
