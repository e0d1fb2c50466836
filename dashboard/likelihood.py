"""The Fidelity page's "Likelihood" tab: how probable reality is under the audited model.

Reads the summary's ``likelihood`` block (``envace probe --likelihood``,
``audit.stats.likelihood``): bits per byte of the real responses with its cluster-bootstrap
interval, the primed-compressor yardstick beside it, and the figure by depth, tool, read/write
and novelty.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from audit.store.models import AuditSummary, Difference, Rate
from dashboard import charts, ui


def frame(table: dict[str, dict[str, Any]], label: str) -> pd.DataFrame:
    """A ``{label: group}`` table of the block as rows (``lo``/``hi`` from ``ci``)."""
    rows = []
    for key, g in (table or {}).items():
        lo, hi = (g.get("ci") or [None, None])[:2]
        rows.append({label: key, "calls": g.get("n"), "bits_per_byte": g.get("bits_per_byte"),
                     "lo": lo, "hi": hi,
                     "compressor_bits_per_byte": g.get("compressor_bits_per_byte")})
    return pd.DataFrame(rows)


def likelihood(s: AuditSummary) -> None:
    """The tab: headline metrics, by depth (chart and table), by tool, read/write, novelty."""
    lk = s.likelihood
    if not lk:
        st.info("No likelihood in this audit. `envace probe --likelihood --model PATH dev.jsonl "
                "--out DIR [--reference train.jsonl]` scores every real response under the model "
                "given the real history, in one forward per trajectory.")
        return
    model = lk.bits_per_byte or Rate()
    comp = (lk.compressor.bits_per_byte if lk.compressor else None) or Rate()
    diff = lk.model_minus_compressor or Difference()
    cols = st.columns(3)
    cols[0].metric("Bits per byte, model", ui.num(model.point),
                   help=ui.ci(model.ci, as_pct=False))
    cols[1].metric("Bits per byte, primed deflate", ui.num(comp.point),
                   help=ui.ci(comp.ci, as_pct=False))
    cols[2].metric("Model − deflate", ui.num(diff.diff),
                   help=ui.ci(diff.ci, as_pct=False))
    st.caption(f"{lk.steps} real responses of {lk.trajectories} trajectories, "
               f"{lk.bytes} bytes, {lk.tokens} tokens. Pooled: total bits / total "
               "bytes; intervals resample whole clusters of the resampling unit. Lower is "
               "better; below the compressor, the model knows more than the train split's text.")
    depth = frame(lk.by_depth or {}, "depth")
    if not depth.empty:
        depth["depth"] = depth["depth"].astype(int)
        st.altair_chart(charts.band(depth, "depth", "bits_per_byte", "lo", "hi",
                                    "Bits per byte by call index", "bits per byte",
                                    percent=False), width="stretch")
    for key, label in (("by_tool", "tool"), ("by_mutates_state", "kind"),
                       ("by_novelty", "novelty")):
        df = frame(getattr(lk, key) or {}, label)
        if not df.empty:
            st.dataframe(df, hide_index=True)
    if lk.not_scored:
        st.warning(f"Calls not scored: {lk.not_scored}")
