"""Canonical forms of tool responses: parse, normalise, flatten, detect errors.

Tool responses are text written either by a real backend or by a model. BFCL backends return
``json.dumps(dict)`` or ``str(value)``, so besides JSON we also accept Python literals
(``None``, ``True``, single-quoted strings) through :func:`ast.literal_eval`. Model output is data:
nothing here ever evaluates code.

- :func:`parse_value` never raises and bounds its work on huge or deeply nested input.
- :func:`canonical_text` is the form scorers compare: sorted keys, compact separators.
- :func:`flatten_leaves` turns a value into ``{path: leaf}`` for structural scoring.
- :func:`is_error_response` says whether a response reports a failure.

Example::

    >>> canonical_text("{'b': None, 'a': True}")
    '{"a":true,"b":null}'
"""

from __future__ import annotations

import ast
import functools
import json
import math
import re

#: Texts longer than this are not parsed at all (treated as plain text).
MAX_JSON_CHARS = 2_000_000
#: Python-literal parsing builds an AST, far costlier than JSON: only shorter texts try it.
MAX_LITERAL_CHARS = 100_000
#: Parsed values nested deeper than this are treated as plain text.
MAX_DEPTH = 100

ERROR_PREFIX = "Error during execution:"

_SIMPLE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


class _TooDeep(Exception):
    pass


def _jsonable(value: object, depth: int = 0) -> object:
    """Map a parsed Python literal onto JSON types (tuples and sets become lists, keys strings)."""
    if depth > MAX_DEPTH:
        raise _TooDeep
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, dict):
        return {_key(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [_jsonable(v, depth + 1) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True, default=str))
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)  # complex numbers, Ellipsis


def _key(key: object) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool):
        return json.dumps(key)
    return str(key)


def parse_value(text: str) -> tuple[bool, object]:
    """Parse a tool response (memoised: every scorer of a step parses the same two texts).

    The returned value is shared between callers: treat it as read-only.
    """
    if isinstance(text, str) and len(text) <= _CACHE_MAX_CHARS:
        return _parse_cached(text)
    return _parse_value(text)


_CACHE_MAX_CHARS = 100_000


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> tuple[bool, object]:
    return _parse_value(text)


def _parse_value(text: str) -> tuple[bool, object]:
    """Parse a tool response: ``(True, value)`` on success, ``(False, text)`` otherwise.

    Tries JSON first (control characters allowed inside strings), then a Python literal.
    The value only holds JSON types (dict with str keys, list, str, int, float, bool, None).
    Never raises: oversized (see ``MAX_JSON_CHARS``, ``MAX_LITERAL_CHARS``) or too deeply
    nested (``MAX_DEPTH``) input counts as unparseable.
    """
    if not isinstance(text, str):
        return False, text
    stripped = text.strip()
    if not stripped or len(stripped) > MAX_JSON_CHARS:
        return False, text
    try:
        return True, _jsonable(json.loads(stripped, strict=False))
    except Exception:  # noqa: BLE001 - any failure means "not JSON"
        pass
    if len(stripped) > MAX_LITERAL_CHARS:
        return False, text
    try:
        return True, _jsonable(ast.literal_eval(stripped))
    except Exception:  # noqa: BLE001 - SyntaxError, ValueError, RecursionError, MemoryError...
        return False, text


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _dump(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_text(text: str) -> str:
    """The comparable form of a response (memoised for texts up to 100k characters)."""
    if isinstance(text, str) and len(text) <= _CACHE_MAX_CHARS:
        return _canonical_cached(text)
    return _canonical_text(text)


@functools.lru_cache(maxsize=4096)
def _canonical_cached(text: str) -> str:
    return _canonical_text(text)


def _canonical_text(text: str) -> str:
    """The comparable form of a response.

    A parseable response is dumped as JSON with sorted keys, compact separators and
    ``ensure_ascii=False``. Anything else is stripped with runs of whitespace collapsed to one
    space. The function is idempotent: in the rare case where collapsing whitespace would make
    unparseable text parseable (``'a<newline>b'`` in single quotes), the collapsed text is
    returned as a JSON string so that a second pass gives the same result.
    """
    ok, value = parse_value(text)
    if ok:
        try:
            return _dump(value)
        except Exception:  # noqa: BLE001 - defensive: fall back to text
            pass
    collapsed = _collapse(text if isinstance(text, str) else str(text))
    if parse_value(collapsed)[0]:
        return _dump(collapsed)
    return collapsed


def _child_path(path: str, key: str) -> str:
    if _SIMPLE_KEY.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def flatten_leaves(value: object) -> dict[str, object]:
    """Flatten a parsed value into ``{path: leaf}``.

    Paths read ``a.b[0].c``; keys that are not simple identifiers are quoted in brackets
    (``a["file name.txt"]``) so that paths never collide. A scalar at the root has path ``""``.
    Empty dicts and lists are leaves themselves. Iterative, so depth cannot overflow the stack.
    """
    leaves: dict[str, object] = {}
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict) and node:
            for key in reversed(list(node)):
                stack.append((_child_path(path, _key(key)), node[key]))
        elif isinstance(node, (list, tuple)) and node:
            for i in range(len(node) - 1, -1, -1):
                stack.append((f"{path}[{i}]", node[i]))
        else:
            leaves[path] = node
    return leaves


def _is_error_value(value: object) -> bool:
    if isinstance(value, dict):
        if "error" not in value:
            return False
        flag = value["error"]
        # {"error": null} / {"error": false} / {"error": ""} are success payloads with the field.
        return not (flag is None or flag is False or flag == "" or flag == [] or flag == {})
    if isinstance(value, str):
        return value.lstrip().startswith(ERROR_PREFIX)
    return False


def is_error_response(text: str) -> bool:
    """Whether a response reports a failure.

    True for a top-level object with an ``"error"`` key whose value is not empty/null/false
    (BFCL backends answer ``{"error": "..."}``), and for text starting with
    ``Error during execution:`` (BFCL's executor), also when that text is a quoted JSON string.
    """
    if not isinstance(text, str):
        return False
    if text.lstrip().startswith(ERROR_PREFIX):
        return True
    ok, value = parse_value(text)
    return ok and _is_error_value(value)


def is_number(value: object) -> bool:
    """True for ints and floats, not bools."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def numbers_close(a: float, b: float, rel_tol: float, abs_tol: float = 0.0) -> bool:
    """Equal within tolerance; two NaNs count as equal."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
    except OverflowError:  # huge ints
        return a == b
