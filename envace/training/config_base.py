"""Config system: dataclasses loaded from YAML plus `key=value` overrides (the trainer's config,
`TrainConfig`, is in `envace.training.config`).

Every entry point has one config dataclass (trl style). Every field has a default and a help
string (`opt(default, "help")`), types are checked on load, and `__post_init__` rejects bad
combinations with a message that says what to change:

    cfg = load_config(TrainConfig, "configs/tiny.yaml", ["lr=1e-5", "mode=grpo"])
    dump_yaml(cfg, "runs/x/config.yaml")            # atomic; loads back to an equal config
    print(config_help(TrainConfig))

Overrides are parsed as YAML (`lr=1e-6`, `flag=true`, `scorers=[exact,json_f1]`,
`simulator_model=null`; envace.core.yaml_load); dotted keys reach nested dataclasses
(`optim.lr=1e-6`). Precedence: field defaults < YAML file < overrides, in order.
"""

import copy
import dataclasses
import difflib
import math
import os
import re
import tempfile
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from envace.core.errors import UsageError
from envace.core.infile import read_small_text
from envace.core.outfile import created_mode
from envace.core.yaml_load import YamlError, load_yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value, key or combination is wrong; the message says what to change."""


_BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def opt(default: Any, help: str, *, ge: float | None = None, gt: float | None = None,
        le: float | None = None, lt: float | None = None, why: str = "", **kwargs: Any) -> Any:
    """A dataclass field with a default, a help string and optional bounds (``ge``/``gt``/``le``/
    ``lt``, checked by :func:`check_ranges`; ``why``: said when a value is out of them; a None
    value is never out of range). Lists and dicts are copied per use."""
    bounds = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
    metadata: dict[str, Any] = {"help": help, "bounds": bounds, "why": why}
    if isinstance(default, list | dict | set) or dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def range_text(bounds: dict[str, float]) -> str:
    """``in [0, 1]``, ``in (0, 1]``, ``>= 1``, ...: what the bounds admit."""
    low = next(((k, bounds[k]) for k in ("ge", "gt") if k in bounds), None)
    high = next(((k, bounds[k]) for k in ("le", "lt") if k in bounds), None)
    if low and high:
        return (f"in {'[' if low[0] == 'ge' else '('}{low[1]:g}, "
                f"{high[1]:g}{']' if high[0] == 'le' else ')'}")
    k, v = low or high  # type: ignore[misc]
    return f"{_BOUNDS[k]} {v:g}"


def _within(value: float, bounds: dict[str, float]) -> bool:
    return all({"ge": value >= v, "gt": value > v, "le": value <= v, "lt": value < v}[k]
               for k, v in bounds.items())


def check_ranges(cfg: Any) -> None:
    """ConfigError naming the first field whose value is outside the bounds its ``opt``
    declares (call after :func:`check_types`)."""
    for f in dataclasses.fields(cfg):
        bounds = f.metadata.get("bounds")
        value = getattr(cfg, f.name)
        if bounds and value is not None and not _within(value, bounds):
            why = f.metadata.get("why")
            raise ConfigError(f"{f.name}={value}: set {f.name} {range_text(bounds)}"
                              + (f" ({why})" if why else ""))


def require(ok: bool, message: str) -> None:
    """Raise ConfigError(message) unless ok: the building block of `__post_init__` checks."""
    if not ok:
        raise ConfigError(message)


# -----------------------------------------------------------------------------
# Types: check a value against a field's annotation, with the few coercions YAML needs


def type_name(tp: Any) -> str:
    """Readable name of an annotation: `float`, `str | None`, `one of 'a', 'b'`, `list[str]`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else type_name(a) for a in args)
    if origin is list:
        return f"list[{type_name(args[0])}]" if args else "list"
    return getattr(tp, "__name__", str(tp))


def coerce(value: Any, tp: Any, key: str, source: str = "") -> Any:
    """Return `value` as type `tp`, or raise ConfigError naming the key, type and value.

    Coercions: int -> float; a string that reads as a number -> int/float (PyYAML reads `1e-6` as
    a string); a comma-separated string -> list. Never bool <-> number, never number -> str.
    A float must be finite (`inf`, `nan` and YAML's `.inf` are refused).
    """
    where = f" (from {source})" if source else ""

    def fail(hint: str = "") -> typing.NoReturn:
        raise ConfigError(
            f"{key}{where} expects {type_name(tp)}, got {value!r} ({type(value).__name__}){hint}"
        )

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        kinds = [a for a in args if a is not type(None)]
        if len(kinds) == 1:  # `X | None`: X's own message (e.g. "give a finite number")
            try:
                return coerce(value, kinds[0], key, source)
            except ConfigError as e:
                raise ConfigError(f"{e} (or null)") from None
        for arg in kinds:
            try:
                return coerce(value, arg, key, source)
            except ConfigError:
                pass
        fail()
    if origin is Literal:
        if value in args:
            return value
        close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
        fail(f"; did you mean {close[0]!r}?" if close else "")
    if origin is list or tp is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            fail()
        item = args[0] if args else Any
        return [coerce(v, item, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        fail("; write true or false")
    if tp is int:
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                fail()
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        fail()
    if tp is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                fail()
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                if math.isfinite(value):
                    return float(value)
            except OverflowError:  # an int beyond float's range
                pass
            fail("; give a finite number")
        fail()
    if tp is str:
        if isinstance(value, str):
            return value
        fail("; quote it if a string is meant")
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    fail()


def _fields(cls: type) -> dict[str, tuple[dataclasses.Field, Any]]:
    """Field name -> (field, resolved annotation) of a dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls) if f.init}


def _is_config(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def valid_keys(cls: type, prefix: str = "") -> list[str]:
    """All settable keys of a config class, nested ones dotted (`optim.lr`)."""
    keys = []
    for name, (_, tp) in _fields(cls).items():
        if _is_config(tp):
            keys += valid_keys(tp, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def check_types(cfg: Any) -> None:
    """Coerce every field of `cfg` to its annotation in place (call first in `__post_init__`)."""
    for name, (_, tp) in _fields(type(cfg)).items():
        if not _is_config(tp):
            setattr(cfg, name, coerce(getattr(cfg, name), tp, name))


# -----------------------------------------------------------------------------
# Loading


def _unknown(key: str, cls: type, source: str) -> ConfigError:
    keys = valid_keys(cls)
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else f"valid keys: {', '.join(keys)}"
    return ConfigError(f"unknown config key {key!r} (from {source}); {hint}")


def _flatten(data: dict, cls: type, prefix: str = "") -> dict[str, Any]:
    """A YAML mapping as {dotted key: value}, descending into mappings under nested configs."""
    fields = _fields(cls)
    out = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if k in fields and _is_config(fields[k][1]) and isinstance(v, dict):
            out.update(_flatten(v, fields[k][1], f"{key}."))
        else:
            out[key] = v  # unknown keys are reported by _set, with suggestions
    return out


def _accepts_str(tp: Any) -> bool:
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else ()
    return tp is str or str in args


def _set(values: dict, cls: type, key: str, value: Any, source: str, raw: str | None) -> None:
    """Type-check one dotted key against `cls` and store it in the nested dict `values`."""
    *path, last = str(key).split(".")
    sub, node = cls, values
    for part in path:
        fields = _fields(sub)
        if part not in fields or not _is_config(fields[part][1]):
            raise _unknown(key, cls, source)
        sub, node = fields[part][1], node.setdefault(part, {})
    fields = _fields(sub)
    if last not in fields:
        why = getattr(sub, "REMOVED", {}).get(last)
        if why is not None:
            raise ConfigError(f"config key {key!r} (from {source}) was removed: {why}; delete it")
        raise _unknown(key, cls, source)
    tp = fields[last][1]
    if _is_config(tp):
        raise ConfigError(
            f"{key} (from {source}) is a section: give a mapping of its fields, or set them one "
            f"by one with dotted keys ({key}.<field>=...)"
        )
    if raw is not None and _accepts_str(tp) and value is not None and not isinstance(value, str):
        value = raw  # `run_name=007` means the string "007", not the int 7
    node[last] = coerce(value, tp, key, source)


def _build(cls: type[T], values: dict) -> T:
    kwargs = {}
    for name, (_, tp) in _fields(cls).items():
        if name in values:
            kwargs[name] = _build(tp, values[name]) if _is_config(tp) else values[name]
    return cls(**kwargs)


def load_config(cls: type[T], yaml_path: str | os.PathLike | None, overrides: list[str],
                drop_removed: bool = False) -> T:
    """Build `cls` from its defaults, then a YAML file (optional), then `key=value` overrides.

    Raises ConfigError for an unknown key (with the closest valid keys and where it came from), a
    key the class lists as removed (its `REMOVED`: key -> why), a value of the wrong type, a
    malformed override, or a combination `__post_init__` rejects. ``drop_removed``: the YAML
    file's removed keys are dropped instead (a run's own config.yaml, written before they were
    removed); overrides still name them as removed.
    """
    values: dict = {}
    sources: dict[str, str] = {}  # dotted key -> where its value came from
    if yaml_path is not None:
        source = str(yaml_path)
        try:
            # a regular file of at most 16 MiB: a FIFO, a device or a huge file is refused
            data = load_yaml(read_small_text(yaml_path, what="config file")) or {}
        except UnicodeDecodeError as e:
            raise ConfigError(f"cannot read config file {source}: it is not UTF-8 text (byte "
                              f"{e.object[e.start:e.start + 1]!r} at position {e.start}); give a "
                              "YAML file such as configs/tiny.yaml") from e
        except (OSError, ValueError, yaml.YAMLError, UsageError) as e:
            raise ConfigError(f"cannot read config file {source}: {e}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"{source} must hold a mapping of keys to values, not {data!r}")
        for key, value in _flatten(data, cls).items():
            if drop_removed and str(key) in getattr(cls, "REMOVED", {}):
                continue
            _set(values, cls, key, value, source, raw=None)
            sources[str(key)] = f"{source}"

    for item in overrides:
        source = f"override {item!r}"
        key, sep, raw = item.removeprefix("--").partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{source} is not of the form key=value")
        key, raw = key.strip(), raw.strip()
        try:
            value = load_yaml(raw) if raw else ""
        except YamlError:
            value = raw
        _set(values, cls, key, value, source, raw=raw)
        sources[key] = source

    try:
        return _build(cls, values)
    except ConfigError as e:
        named = [k for k in sources if re.search(rf"(?<![\w.]){re.escape(k)}(?![\w.])", str(e))]
        if named:  # the keys the message names, each with where its value came from
            where = "; ".join(f"{k} from {sources[k]}" for k in named)
            raise ConfigError(f"{e} ({where})") from e
        origin = " + ".join(([str(yaml_path)] if yaml_path else []) + overrides) or "defaults"
        raise ConfigError(f"{e} [config from: {origin}]") from e


def parse_cli(cls: type[T], argv: list[str]) -> T:
    """Config from command-line words: `[--config PATH] [key=value ...]`."""
    path, overrides, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("--config needs a path: --config configs/tiny.yaml")
            path, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
        i += 1
    return load_config(cls, path, overrides)


# -----------------------------------------------------------------------------
# Saving and help


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain nested dicts and lists (YAML / JSON ready)."""
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: Any, path: str | os.PathLike) -> None:
    """Write the config as YAML atomically: a temp file in the same folder, then os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(to_dict(cfg), sort_keys=False, allow_unicode=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, created_mode())  # not mkstemp's 0600
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def config_help(cls: type, prefix: str = "") -> str:
    """One line per key: `name (type, default X): help`; nested configs dotted."""
    lines = []
    defaults = cls()
    for name, (f, tp) in _fields(cls).items():
        if _is_config(tp):
            lines.append(config_help(tp, f"{prefix}{name}."))
            continue
        help_text = f.metadata.get("help", "")
        bounds = f.metadata.get("bounds")
        shown = f", {range_text(bounds)}" if bounds else ""
        lines.append(f"  {prefix}{name} ({type_name(tp)}, default {getattr(defaults, name)!r}"
                     f"{shown})")
        if help_text:
            lines.append(
                textwrap.fill(help_text, 100, initial_indent=" " * 6, subsequent_indent=" " * 6)
            )
    return "\n".join(lines)
