"""A tool's input schema checked against a call's arguments in bounded time (issue 39).

jsonschema matches ``pattern`` and ``patternProperties`` (and, beside them,
``additionalProperties`` and ``unevaluatedProperties``) with Python's ``re``, which no timeout or
signal interrupts: a server's ``"pattern": "^(a|aa)+$"`` against ``"a" * 40 + "!"`` ran for
minutes in envace's own process, past ``--call-timeout``, before the server was even called.
Here, while a check runs:

- every regex jsonschema matches goes through the ``regex`` module with ``timeout=`` the time
  left (:func:`install` puts a stand-in for ``re`` into jsonschema's keyword modules; outside a
  check it is ``re`` itself);
- every keyword checks the deadline, so no other schema (many branches, ``$ref`` loops) runs on;
- ``uniqueItems`` takes linear time (jsonschema's falls back to comparing every pair: minutes for
  20,000 objects);
- a schema that recurses without end, or arguments nested past Python's recursion limit, stop.

Any of these, a pattern that does not compile, or a schema the validator cannot resolve, is
:class:`SchemaLimit`'s one line: the call is refused (an error result), the server not called.

    validator = compile_schema(tool.input_schema)          # None: a schema jsonschema cannot read
    problem = check_arguments(validator, {"x": "aaa"}, budget_s=5.0)   # None, or why not
"""

from __future__ import annotations

import functools
import re
import threading
import time
from typing import Any

import jsonschema
import regex

#: The longest one call's arguments are checked against its tool's schema (at most the call's
#: own timeout): a valid argument takes microseconds.
SCHEMA_CHECK_S = 5.0

_state = threading.local()  # .deadline (monotonic seconds) and .budget while a check runs


class SchemaLimit(Exception):
    """A check that could not finish (time, a broken pattern, recursion): one line why."""


def _deadline() -> float | None:
    return getattr(_state, "deadline", None)


def _left() -> float:
    deadline = _deadline()
    if deadline is None:
        return float("inf")
    left = deadline - time.monotonic()
    if left <= 0:
        raise SchemaLimit(f"checking the arguments against the tool's input schema took more "
                          f"than {_state.budget:g} s")
    return left


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> Any:
    return regex.compile(pattern)


class _BoundedRe:
    """``re`` for jsonschema's keyword modules: ``search`` bounded while a check runs."""

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)

    @staticmethod
    def search(pattern: Any, string: Any, flags: int = 0) -> Any:
        if _deadline() is None or flags or not isinstance(pattern, str):
            return re.search(pattern, string, flags)
        left = _left()
        try:
            compiled = _compiled(pattern)
        except (regex.error, RecursionError, MemoryError) as exc:
            raise SchemaLimit(f"the schema's pattern {pattern[:80]!r} does not compile: "
                              f"{exc}"[:300]) from None
        try:
            return compiled.search(string, timeout=left)
        except TimeoutError:
            raise SchemaLimit(f"the schema's pattern {pattern[:80]!r} took more than "
                              f"{_state.budget:g} s to match the argument") from None


def install() -> bool:
    """Put :class:`_BoundedRe` in jsonschema's modules that match regexes (once; True when
    every one of them was found)."""
    import importlib

    found = True
    for name in ("jsonschema._keywords", "jsonschema._legacy_keywords", "jsonschema._utils"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            found = False
            continue
        if isinstance(getattr(module, "re", None), _BoundedRe):
            continue
        if getattr(module, "re", None) is not re:
            found = False
            continue
        module.re = _BoundedRe()  # type: ignore[attr-defined]
    return found


def _unique_key(x: Any) -> Any:
    """A hashable key equal for values JSON Schema calls equal (1 == 1.0, true != 1)."""
    if isinstance(x, bool) or x is None:
        return ("b", x)
    if isinstance(x, str):
        return ("s", x)
    if isinstance(x, int | float):
        return ("n", x)
    if isinstance(x, list | tuple):
        return ("a", tuple(_unique_key(i) for i in x))
    if isinstance(x, dict):
        return ("o", frozenset((k, _unique_key(v)) for k, v in x.items()))
    return ("?", id(x))


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Any:
    if unique and validator.is_type(instance, "array"):
        seen: set[Any] = set()
        for item in instance:
            key = _unique_key(item)
            if key in seen:
                yield jsonschema.ValidationError(f"{instance!r:.200} has non-unique elements")
                return
            seen.add(key)


def _ticking(keyword: Any) -> Any:
    def checked(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _left()
        return keyword(validator, value, instance, schema)
    return checked


def compile_schema(schema: Any) -> Any:
    """A bounded validator of ``schema`` (None: a schema jsonschema cannot read: no check)."""
    try:
        cls = jsonschema.validators.validator_for(schema)
        keywords = {k: _ticking(f) for k, f in cls.VALIDATORS.items()}
        keywords["uniqueItems"] = _ticking(_unique_items)
        return jsonschema.validators.extend(cls, keywords)(schema)
    except Exception:  # noqa: BLE001 - a schema jsonschema cannot read: no check
        return None


def check_arguments(validator: Any, arguments: Any, budget_s: float = SCHEMA_CHECK_S
                    ) -> str | None:
    """Why ``arguments`` fail the schema (one line, at most 300 characters), or None."""
    if validator is None:
        return None
    _state.deadline, _state.budget = time.monotonic() + budget_s, budget_s
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    except SchemaLimit as exc:
        return f"{exc} (not checked; the server was not called)"[:300]
    except RecursionError:
        return ("the tool's input schema refers to itself without end, or the arguments nest "
                "too deep to check (the server was not called)")
    except Exception as exc:  # noqa: BLE001 - an unresolvable $ref, a broken keyword value
        return (f"the tool's input schema cannot be checked: {type(exc).__name__}: "
                f"{str(exc)[:200]} (the server was not called)")
    finally:
        _state.deadline = None
    if error is None:
        return None
    where = "/".join(map(str, error.absolute_path))
    return f"{where + ': ' if where else ''}{error.message}"[:300]


install()
