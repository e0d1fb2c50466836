"""Parse BFCL ground-truth call strings such as ``mv(source='a', destination='b')`` safely.

The string is parsed with :mod:`ast` and only literal arguments are accepted
(:func:`ast.literal_eval` on each argument node). Nothing is evaluated: a call whose arguments are
not literals, or whose callee is not a plain name, is rejected with :class:`CallParseError`.
"""

from __future__ import annotations

import ast
from typing import Any


class CallParseError(ValueError):
    """A call string that is not ``name(literal, ..., key=literal, ...)``."""


def parse_call_source(source: str) -> tuple[str, list[Any], dict[str, Any]]:
    """(name, positional literals, keyword literals) of one call string."""
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise CallParseError(f"not a call: {source!r} ({exc.msg})") from None
    node = tree.body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise CallParseError(f"not a plain function call: {source!r}")
    try:
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise CallParseError(f"**kwargs are not allowed: {source!r}")
            kwargs[kw.arg] = ast.literal_eval(kw.value)
    except (ValueError, TypeError, SyntaxError, RecursionError) as exc:
        raise CallParseError(f"arguments must be literals: {source!r} ({exc})") from None
    return node.func.id, args, kwargs


def format_call(name: str, arguments: dict[str, Any]) -> str:
    """A call as BFCL writes it (``name(k=repr(v), ...)``): for bfcl-eval's own executor."""
    inner = ",".join(f"{k}={v!r}" for k, v in arguments.items())
    return f"{name}({inner})"
