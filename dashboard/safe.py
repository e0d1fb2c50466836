"""Text from run and trajectory files, made inert before it reaches Streamlit's markdown.

Trajectory ids, tool names, messages, file names and reports come from files anyone can write:
rendered as markdown, ``![x](https://host/p.png)`` makes every browser that opens the page fetch
from that host (a tracking pixel), ``[x](https://...)`` plants a link and a stray backtick
breaks out of a code span. Pages put such text through these helpers (or show it with
``st.text`` / ``st.code`` / ``st.dataframe`` / escaped ``st.html``, which never parse markdown):

    st.markdown(f"**Step {md(step)}** · {code(call)}")

- :func:`md` — every ASCII punctuation character backslash-escaped (CommonMark lets any of
  them be escaped), line breaks as spaces: no image, link, emphasis, heading, HTML, entity,
  LaTeX (``$``), Streamlit directive (``:red[...]``) or emoji shortcode survives. GFM's
  autolink literals (``http://…``, ``www.…``, ``a@b.c``) are found in the text *after*
  escapes are resolved, so an invisible word joiner (U+2060) goes before ``://``, ``@``,
  ``mailto:``/``xmpp:``'s colon and ``www``'s dot: the text reads the same, nothing links.
- :func:`code` — an inline code span whose fence is longer than any run of backticks inside,
  so the text cannot close it.
"""

from __future__ import annotations

import re
import string
from typing import Any

_PUNCT = re.compile("([" + re.escape(string.punctuation) + "])")
_LINKISH = re.compile(r"(?i)(://|@|(?<=\bwww)\.|(?<=\bmailto):|(?<=\bxmpp):)")
JOINER = "\u2060"  # WORD JOINER: zero width, breaks an autolink literal
_TICKS = re.compile("`+")


def md(value: Any) -> str:
    """``value`` as literal text inside markdown (one line)."""
    text = " ".join(str(value).splitlines())
    return _PUNCT.sub(r"\\\1", _LINKISH.sub(JOINER + r"\1", text))


def code(value: Any) -> str:
    """``value`` as an inline code span that nothing inside can close (one line)."""
    text = " ".join(str(value).splitlines())
    longest = max((len(t) for t in _TICKS.findall(text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"  # CommonMark strips one space from both sides
