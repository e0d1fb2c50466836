"""Data shown to people stays data: escaping for a terminal and for Markdown.

    print(terminal_safe(tool_name))   # "\\x1b]8;;http://x\\x07": no escape sequence reaches the tty
    f"| {markdown_safe(tool)} |"      # no HTML, link, image, table cell break or new line

Tool names, trajectory ids, file names and reasons come from files and plugins: an ANSI/OSC
escape in one would drive the user's terminal, an ``<img src=...>`` or ``![](...)`` in
``report.md`` would be a tracking pixel for whoever renders it, a ``|`` or a newline would break
its tables. Both functions are pure and keep every other character as it is.
"""

from __future__ import annotations

import html
import re

# C0 and C1 controls, DEL, line/paragraph separators, bidi overrides, lone surrogates
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|!])")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def terminal_safe(text: object) -> str:
    """``text`` with every control character (escape sequences, new lines, bidi overrides,
    lone surrogates) written as a visible ``\\xNN`` / ``\\uNNNN``."""
    return _UNSAFE.sub(_escape, str(text))


def markdown_safe(text: object) -> str:
    """``text`` for one line or table cell of Markdown: HTML escaped, Markdown's link, image,
    emphasis, code and table characters backslash-escaped, controls made visible."""
    return _MD_SPECIAL.sub(r"\\\1", html.escape(terminal_safe(text), quote=False))
