"""One audited trajectory as a conversation: each rehearsed tool response beside the actual one.

Differences are highlighted by the JSON-aware diff (``dashboard.jsondiff``); the first
divergence is marked; when the trajectory is aligned against a reference (``dashboard.align``)
each step says whether its call was inserted or has other arguments. Works from the audit's
``steps.jsonl`` alone when the trajectory file is not at hand (no user or assistant text then).
Every text from the files is shown as text (``st.text``, ``st.code``, escaped HTML, or through
``dashboard.safe`` inside markdown): a trajectory cannot plant markdown images or links.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import streamlit as st

from dashboard.jsondiff import json_diff
from dashboard.safe import code, md

MAX_TEXT = 1500
OP_BADGE = {"same": ":green-badge[same call as the reference]",
            "arguments differ": ":orange-badge[arguments differ from the reference]",
            "inserted": ":violet-badge[inserted: not in the reference]"}


def call_text(tool: str, args: Any) -> str:
    """``tool(a=1, b="x")`` for a call's arguments (raw text when malformed)."""
    if isinstance(args, dict):
        inner = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
        return f"{tool}({inner})"
    return f"{tool}({args!r})  # malformed arguments"


def _text(body: str) -> None:
    if len(body) <= MAX_TEXT:
        st.text(body)
        return
    st.text(body[:MAX_TEXT] + " …")
    with st.expander(f"whole message ({len(body)} characters)"):
        st.text(body)


def _scores(rec: dict[str, Any]) -> str:
    return " · ".join(f"{md(k)} {v:.2f}" for k, v in (rec.get("scores") or {}).items()
                      if isinstance(v, int | float) and not isinstance(v, bool))


#: The left column's heading: what wrote the recorded response.
RECORDED_REHEARSED = "Rehearsed (written by the policy)"
RECORDED_REAL = "Recorded (written by the real environment)"


def render_step(rec: dict[str, Any], first_div: int | None, op: str | None = None) -> None:
    """A step's verdict, scores and the two responses side by side with their diff."""
    k = rec.get("step")
    with st.container(border=True):
        if first_div is not None and k == first_div:
            st.markdown(f":red-background[⚑ **First divergence** — step {md(k)}: from here on the "
                        "rehearsal no longer matches reality.]")
        verdict = ":red[**✗ diverged**]" if rec.get("diverged") else ":green[**✓ matches**]"
        if rec.get("unanswered"):
            verdict = ":gray[no response recorded]"
        badge = f" {OP_BADGE[op]}" if op in OP_BADGE else ""
        call = code(call_text(rec.get("tool", "?"), rec.get("arguments")))
        st.markdown(f"**Step {md(k)}** · {call} · {verdict} · {_scores(rec)}{badge}")
        real_history = rec.get("source_rehearsed") is False
        if real_history:
            st.caption("This response was written by the real environment (not rehearsed): the "
                       "replay checks that reality repeats it.")
        d = json_diff(rec.get("rehearsed"), rec.get("actual"))
        left, right = st.columns(2)
        with left:
            st.caption(RECORDED_REAL if real_history else RECORDED_REHEARSED)
            st.html(d.left_html)
        with right:
            err = " — an error" if rec.get("actual_error") else ""
            st.caption(f"Actual (the real environment){err}")
            st.html(d.right_html)
        if d.leaves:
            shown = "; ".join(f"{md(x.path)} {md(x.kind)}" for x in d.leaves[:8])
            more = f" and {len(d.leaves) - 8} more" if len(d.leaves) > 8 else ""
            st.caption(f"{len(d.leaves)} difference(s): {shown}{more}")
        refs = rec.get("references") or {}
        if refs:
            with st.expander("Reference world models on this call"):
                for name, r in refs.items():
                    st.markdown(f"**{md(name)}** · {_scores(r if isinstance(r, dict) else {})}")
                    st.code(str(r.get("response", ""))[:MAX_TEXT], language="json")


def render_skipped(skips: dict[int, str] | None, after: int) -> None:
    """The reference's calls this trajectory skips right after step ``after`` (-1: first)."""
    calls = (skips or {}).get(after)
    if calls:
        st.markdown(":violet-badge[skipped: the reference calls here]")
        st.code(calls.rstrip("\n"), language="python")


def render_steps_only(steps: dict[int, dict[str, Any]], first_div: int | None,
                      ops: dict[int, str] | None = None,
                      skips: dict[int, str] | None = None) -> None:
    """The audited calls in order, without the surrounding conversation."""
    render_skipped(skips, -1)
    for k in sorted(steps):
        render_step(steps[k], first_div, (ops or {}).get(k))
        render_skipped(skips, k)


def _call_ids(traj: dict[str, Any]) -> dict[str, int]:
    """Call id -> step index (the 0-based position among all tool calls)."""
    out: dict[str, int] = {}
    for m in traj.get("messages") or []:
        if m.get("role") == "assistant":
            for c in m.get("tool_calls") or []:
                out.setdefault(str(c.get("id")), len(out))
    return out


def render_conversation(traj: dict[str, Any], steps: dict[int, dict[str, Any]],
                        first_div: int | None, ops: dict[int, str] | None = None,
                        skips: dict[int, str] | None = None) -> None:
    """The whole conversation; tool messages become audited step boxes."""
    ids = _call_ids(traj)
    shown: set[int] = set()
    render_skipped(skips, -1)
    for m in traj.get("messages") or []:
        role = m.get("role")
        content = m.get("content") or ""
        if not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False)
        if role == "system":
            st.caption("system")
            _text(content)
        elif role == "user":
            with st.chat_message("user"):
                _text(content)
        elif role == "assistant":
            calls = m.get("tool_calls") or []
            if not content.strip() and not calls:
                continue  # the empty message that ends a turn
            with st.chat_message("assistant"):
                if content.strip():
                    _text(content)
                for c in calls:
                    fn = c.get("function") or {}
                    args = fn.get("arguments")
                    if isinstance(args, str):
                        with contextlib.suppress(ValueError):
                            args = json.loads(args)
                    st.code(f"[step {ids.get(str(c.get('id')), '?')}] "
                            f"{call_text(fn.get('name', '?'), args)}", language="python")
        elif role == "tool":
            k = ids.get(str(m.get("tool_call_id")))
            if k is not None and k in steps:
                render_step(steps[k], first_div, (ops or {}).get(k))
                render_skipped(skips, k)
                shown.add(k)
            else:
                st.caption(f"tool {code(m.get('name'))} (not in the audit):")
                _text(content)
    rest = {k: v for k, v in steps.items() if k not in shown}
    if rest:
        st.caption("Audited calls the conversation does not show:")
        for k in sorted(rest):
            render_step(rest[k], first_div, (ops or {}).get(k))
