"""A JSON-aware diff of a rehearsed tool response against the actual one, rendered as HTML.

When both responses parse as JSON containers the trees are compared leaf by leaf: object keys by
name, list items aligned with ``difflib`` (so an inserted item does not shift every later one);
each side is pretty-printed with the differing leaves highlighted. Otherwise the texts are
diffed word by word. All text is HTML-escaped.

    d = json_diff('{"a": 1, "b": [1, 2]}', '{"a": 2, "b": [1, 2]}')
    d.leaves  # [LeafDiff(path='$.a', kind='changed', left='1', right='2')]
    d.left_html, d.right_html
"""

from __future__ import annotations

import difflib
import html
import json
import re
from dataclasses import dataclass, field
from typing import Any

Path_ = tuple[Any, ...]
CHANGED = "background:#fde68a;border-radius:3px"  # a leaf whose value differs
LEFT_ONLY = "background:#fecaca;border-radius:3px"  # only in the rehearsal
RIGHT_ONLY = "background:#bbf7d0;border-radius:3px"  # only in reality
PRE = ("white-space:pre-wrap;word-break:break-word;font-family:monospace;font-size:0.8rem;"
       "margin:0;padding:0.5rem;background:#f8fafc;border-radius:6px")


@dataclass(frozen=True)
class LeafDiff:
    """One difference: JSONPath-like location, kind (changed, missing, extra), both values."""

    path: str
    kind: str  # "changed" | "missing" (only in actual) | "extra" (only in rehearsed)
    left: str
    right: str


@dataclass
class Diff:
    """Both sides as HTML and the list of differing leaves (empty when equal)."""

    left_html: str
    right_html: str
    leaves: list[LeafDiff] = field(default_factory=list)
    structured: bool = False  # True when compared as JSON

    @property
    def equal(self) -> bool:
        return not self.leaves


def _parse(text: str) -> tuple[Any, bool]:
    try:
        return json.loads(text), True
    except (ValueError, TypeError, RecursionError):
        return None, False


def _path_str(path: Path_) -> str:
    out = "$"
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _short(v: Any) -> str:
    s = json.dumps(v, ensure_ascii=False, sort_keys=True)
    return s if len(s) <= 80 else s[:77] + "…"


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, ensure_ascii=False)


def _compare(a: Any, b: Any, pa: Path_, pb: Path_, ml: dict, mr: dict, leaves: list) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a:
            if k in b:
                _compare(a[k], b[k], (*pa, k), (*pb, k), ml, mr, leaves)
            else:
                ml[(*pa, k)] = LEFT_ONLY
                leaves.append(LeafDiff(_path_str((*pa, k)), "extra", _short(a[k]), ""))
        for k in b:
            if k not in a:
                mr[(*pb, k)] = RIGHT_ONLY
                leaves.append(LeafDiff(_path_str((*pb, k)), "missing", "", _short(b[k])))
        return
    if isinstance(a, list) and isinstance(b, list):
        sm = difflib.SequenceMatcher(None, [_canon(x) for x in a], [_canon(x) for x in b],
                                     autojunk=False)
        for op, i1, i2, j1, j2 in sm.get_opcodes():
            if op == "equal":
                continue
            paired = min(i2 - i1, j2 - j1) if op == "replace" else 0
            for k in range(paired):
                _compare(a[i1 + k], b[j1 + k], (*pa, i1 + k), (*pb, j1 + k), ml, mr, leaves)
            for i in range(i1 + paired, i2):
                ml[(*pa, i)] = LEFT_ONLY
                leaves.append(LeafDiff(_path_str((*pa, i)), "extra", _short(a[i]), ""))
            for j in range(j1 + paired, j2):
                mr[(*pb, j)] = RIGHT_ONLY
                leaves.append(LeafDiff(_path_str((*pb, j)), "missing", "", _short(b[j])))
        return
    if type(a) is not type(b) and not (_is_num(a) and _is_num(b)) or a != b:
        ml[pa] = CHANGED
        mr[pb] = CHANGED
        leaves.append(LeafDiff(_path_str(pa), "changed", _short(a), _short(b)))


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _render(v: Any, marks: dict[Path_, str], path: Path_ = (), indent: int = 0) -> str:
    """Pretty JSON as escaped HTML; a marked path is wrapped in a highlighted span."""
    pad = "  " * indent
    if isinstance(v, dict) and v:
        items = []
        for k, x in v.items():
            key = html.escape(json.dumps(k, ensure_ascii=False))
            body = f"{pad}  {key}: {_render(x, marks, (*path, k), indent + 1).lstrip()}"
            items.append(_mark(body, marks.get((*path, k)), pad + "  "))
        text = "{\n" + ",\n".join(items) + "\n" + pad + "}"
    elif isinstance(v, list) and v:
        items = []
        for i, x in enumerate(v):
            body = f"{pad}  {_render(x, marks, (*path, i), indent + 1).lstrip()}"
            items.append(_mark(body, marks.get((*path, i)), pad + "  "))
        text = "[\n" + ",\n".join(items) + "\n" + pad + "]"
    else:
        text = html.escape(json.dumps(v, ensure_ascii=False))
    return pad + text


def _mark(body: str, style: str | None, pad: str) -> str:
    if not style:
        return body
    return f'{pad}<span style="{style}">{body[len(pad):]}</span>'


_TOKEN = re.compile(r"\s+|\w+|[^\w\s]")


def _text_diff(a: str, b: str) -> Diff:
    ta, tb = _TOKEN.findall(a), _TOKEN.findall(b)
    sm = difflib.SequenceMatcher(None, ta, tb, autojunk=False)
    left, right, leaves = [], [], []
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        sa, sb = "".join(ta[i1:i2]), "".join(tb[j1:j2])
        if op == "equal":
            left.append(html.escape(sa))
            right.append(html.escape(sb))
            continue
        if sa:
            left.append(f'<span style="{LEFT_ONLY if not sb else CHANGED}">{html.escape(sa)}'
                        "</span>")
        if sb:
            right.append(f'<span style="{RIGHT_ONLY if not sa else CHANGED}">{html.escape(sb)}'
                         "</span>")
        if sa.strip() or sb.strip():
            kind = "changed" if sa and sb else ("extra" if sa else "missing")
            leaves.append(LeafDiff(f"text@{i1}", kind, sa[:80], sb[:80]))
    return Diff(_pre("".join(left)), _pre("".join(right)), leaves, structured=False)


def _pre(inner: str) -> str:
    return f'<pre style="{PRE}">{inner}</pre>'


def json_diff(left: str | None, right: str | None) -> Diff:
    """Diff two tool responses (rehearsed on the left, actual on the right)."""
    left, right = left or "", right or ""
    a, ok_a = _parse(left)
    b, ok_b = _parse(right)
    if ok_a and ok_b and isinstance(a, dict | list) and isinstance(b, dict | list):
        ml: dict[Path_, str] = {}
        mr: dict[Path_, str] = {}
        leaves: list[LeafDiff] = []
        if isinstance(a, dict) != isinstance(b, dict):
            ml[()] = mr[()] = CHANGED
            leaves.append(LeafDiff("$", "changed", _short(a), _short(b)))
        else:
            _compare(a, b, (), (), ml, mr, leaves)
        lh, rh = _render(a, ml), _render(b, mr)
        if () in ml:
            lh, rh = _mark(lh, ml[()], ""), _mark(rh, mr[()], "")
        return Diff(_pre(lh), _pre(rh), leaves, structured=True)
    return _text_diff(left, right)
