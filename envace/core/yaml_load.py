"""The one way envace reads a user's YAML: safe loading, with a clear error instead of a crash.

    data = load_yaml(text, "models.yaml")    # YamlError (a ValueError and a yaml.YAMLError)

Every reader of YAML a person wrote (the MCP server config, the training config and its
``key=value`` overrides, the board's models file, a run's ``config.yaml``) goes through it, so
each refuses the same inputs the same way, as one line naming the file:

- text that is not YAML (the parser's error);
- nesting deeper than :data:`MAX_DEPTH` levels (``[[[[...]]]]``: 2 KB of brackets used to raise
  a ``RecursionError`` traceback from the parser); no config of envace is more than a few deep;
- a mapping key given twice (``a:`` twice in ``models:``): plain YAML keeps the last silently,
  so the first would be lost without a word; the error names the key and both lines.

A ``YamlError`` is a ``yaml.YAMLError`` as well as a ``ValueError``: a caller that already
reports either keeps doing so.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_DEPTH = 100  #: levels of nested mappings/sequences accepted


class YamlError(yaml.YAMLError, ValueError):
    """A YAML text refused: not YAML, nested too deeply, or a key given twice."""


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that counts nesting and refuses a duplicate mapping key."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YamlError(f"nested more than {MAX_DEPTH} levels deep (line "
                                f"{mark.line + 1}): not a config")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                    seen.setdefault(key, line)
                except TypeError:  # an unhashable key: SafeLoader refuses it below
                    continue
                if first is not None:
                    raise YamlError(f"the key {key!r} is given twice (lines {first} and "
                                    f"{line}): keep one")
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str, where: str | None = None) -> Any:
    """``text`` decoded as YAML (safe types only), or YamlError prefixed with ``where`` (the
    file's name) for text that is not YAML, nests too deeply or gives a mapping key twice."""
    prefix = f"{where}: " if where else ""
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    except YamlError as exc:
        raise YamlError(f"{prefix}{exc}") from None
    except RecursionError:
        raise YamlError(f"{prefix}nested too deeply to read: not a config") from None
    except yaml.YAMLError as exc:
        raise YamlError(f"{prefix}not YAML: {_why(exc)}") from None
    finally:
        loader.dispose()


def _why(exc: yaml.YAMLError) -> str:
    """The parser's problem and where, on one line."""
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if not problem:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{problem}" + (f" (line {mark.line + 1}, column {mark.column + 1})" if mark else "")
