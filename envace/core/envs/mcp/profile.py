"""MCP server profiles: the user's YAML file that says how to start each server.

A profile is the only place a command to run can come from: a trajectory or a task file names a
profile (``env.name = "mcp:<profile>"``) but can never make envace start a command. The file is
passed as ``--mcp-config FILE`` (which sets ``ENVACE_MCP_CONFIG`` for the process and its
workers) or named by ``ENVACE_MCP_CONFIG`` directly. Its format is ``docs/spec/mcp_profile.md``::

    servers:
      ledger:
        command: python3
        args: [ledger_server.py]
        env: {LEDGER_DB: "{workdir}/ledger.json"}

    profile = load_profile("ledger")            # from ENVACE_MCP_CONFIG
    profile.argv(workdir)                       # the command with {workdir} filled in
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from envace.core.errors import UsageError
from envace.core.infile import read_small_text
from envace.core.yaml_load import load_yaml

CONFIG_ENV = "ENVACE_MCP_CONFIG"
PREFIX = "mcp:"
PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
WORKDIR = "{workdir}"
CONFIG_DIR = "{config_dir}"
PYTHON = "{python}"
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_STARTUP_TIMEOUT_S = 30.0
_KEYS = {"command", "args", "env", "cwd", "setup", "writes", "reads", "state_ignore",
         "volatile", "timeout_s", "startup_timeout_s", "description"}


class ProfileError(ValueError):
    """A missing, unreadable or malformed MCP config, or an unknown profile."""


@dataclass(frozen=True)
class Profile:
    """One server profile (see ``docs/spec/mcp_profile.md`` for every field)."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    setup: tuple[tuple[str, ...], ...] = ()
    writes: frozenset[str] = frozenset()
    reads: frozenset[str] = frozenset()
    state_ignore: tuple[str, ...] = ()
    volatile: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    base_dir: str = "."
    description: str = ""

    @property
    def env_name(self) -> str:
        """The environment name of this profile (``mcp:<profile>``)."""
        return PREFIX + self.name

    def fill(self, text: str, workdir: str) -> str:
        """``text`` with ``{workdir}`` replaced by the trajectory's working directory and
        ``{config_dir}`` by the config file's folder, ``{python}`` by envace's interpreter."""
        return (text.replace(WORKDIR, workdir).replace(CONFIG_DIR, self.base_dir)
                .replace(PYTHON, sys.executable))

    def argv(self, workdir: str) -> tuple[str, list[str]]:
        """(command, arguments) with ``{workdir}`` filled in; a relative command path that names
        a file beside the config is taken from there (``./server.py`` style)."""
        return self._resolve(self.fill(self.command, workdir)), [
            self.fill(a, workdir) for a in self.args]

    def environ(self, workdir: str) -> dict[str, str]:
        """The profile's environment variables with ``{workdir}`` filled in."""
        return {k: self.fill(v, workdir) for k, v in self.env.items()}

    def setup_commands(self, workdir: str) -> list[list[str]]:
        """The setup commands (run in the workdir before the server starts), filled in."""
        return [[self._resolve(self.fill(c[0], workdir)), *(self.fill(a, workdir) for a in c[1:])]
                for c in self.setup]

    def _resolve(self, command: str) -> str:
        if os.sep in command and not os.path.isabs(command):
            return str((Path(self.base_dir) / command).resolve())
        return command


def _strs(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
        raise ProfileError(f"{what} must be a list of strings")
    return tuple(str(v) for v in value)


def _positive(value: Any, what: str, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ProfileError(f"{what} must be a positive number of seconds, not {value!r}")
    return float(value)


def parse_profile(name: str, raw: Any, base_dir: str = ".") -> Profile:
    """One profile from its YAML mapping; :class:`ProfileError` naming the bad field."""
    where = f"MCP profile {name!r}"
    if not PROFILE_NAME.match(name):
        raise ProfileError(f"{where}: a profile name is letters, digits, '_', '.', '-'")
    if not isinstance(raw, dict):
        raise ProfileError(f"{where} must be a mapping with at least 'command'")
    unknown = sorted(set(map(str, raw)) - _KEYS)
    if unknown:
        raise ProfileError(f"{where}: unknown field(s) {', '.join(unknown)}; "
                           f"known: {', '.join(sorted(_KEYS))}")
    command = raw.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ProfileError(f"{where}: 'command' must be a non-empty string")
    env = raw.get("env") or {}
    if not isinstance(env, dict):
        raise ProfileError(f"{where}: 'env' must be a mapping of names to strings")
    setup_raw = raw.get("setup") or []
    if not isinstance(setup_raw, list):
        raise ProfileError(f"{where}: 'setup' must be a list of commands (each a list)")
    setup = tuple(_strs(c, f"{where}: each 'setup' command") for c in setup_raw)
    if any(not c for c in setup):
        raise ProfileError(f"{where}: a 'setup' command cannot be empty")
    volatile = _strs(raw.get("volatile"), f"{where}: 'volatile'")
    for pattern in volatile:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ProfileError(f"{where}: 'volatile' pattern {pattern!r}: {exc}") from None
    writes = frozenset(_strs(raw.get("writes"), f"{where}: 'writes'"))
    reads = frozenset(_strs(raw.get("reads"), f"{where}: 'reads'"))
    if writes & reads:
        raise ProfileError(f"{where}: tools both in 'writes' and 'reads': "
                           f"{', '.join(sorted(writes & reads))}")
    return Profile(
        name=name, command=command, args=_strs(raw.get("args"), f"{where}: 'args'"),
        env={str(k): str(v) for k, v in env.items()}, setup=setup, writes=writes, reads=reads,
        state_ignore=_strs(raw.get("state_ignore"), f"{where}: 'state_ignore'"),
        volatile=volatile,
        timeout_s=_positive(raw.get("timeout_s"), f"{where}: 'timeout_s'", DEFAULT_TIMEOUT_S),
        startup_timeout_s=_positive(raw.get("startup_timeout_s"), f"{where}: 'startup_timeout_s'",
                                    DEFAULT_STARTUP_TIMEOUT_S),
        base_dir=base_dir, description=str(raw.get("description") or ""),
    )


def load_config(path: str | os.PathLike[str]) -> dict[str, Profile]:
    """Every profile of a config file."""
    p = Path(path)
    try:
        raw = load_yaml(read_small_text(p, what="the MCP config"))
    except UsageError as exc:  # not a regular file, past 16 MiB, not UTF-8: never waited on
        raise ProfileError(str(exc)) from None
    except OSError as exc:
        raise ProfileError(f"cannot read the MCP config {p}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"the MCP config {p} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("servers"), dict):
        raise ProfileError(f"the MCP config {p} must be a mapping with 'servers: {{name: ...}}'")
    base = str(p.resolve().parent)
    return {str(n): parse_profile(str(n), v, base) for n, v in raw["servers"].items()}


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The config file to read: ``explicit``, else ``$ENVACE_MCP_CONFIG``."""
    path = explicit or os.environ.get(CONFIG_ENV)
    if not path:
        raise ProfileError(f"an mcp:<profile> environment needs a server config: pass "
                           f"--mcp-config FILE or set {CONFIG_ENV}")
    return Path(path)


def load_profile(name: str, config: str | os.PathLike[str] | None = None) -> Profile:
    """The profile ``name`` (without the ``mcp:`` prefix) of the config in use."""
    path = config_path(config)
    profiles = load_config(path)
    if name not in profiles:
        raise ProfileError(f"no MCP profile {name!r} in {path}; profiles: "
                           f"{', '.join(profiles) or '(none)'}")
    return profiles[name]


def use_config(path: str | os.PathLike[str]) -> Path:
    """Make ``path`` the config of this process and of the processes it starts (workers): an
    absolute path in ``ENVACE_MCP_CONFIG``; checked now, so a bad file fails before any work."""
    p = Path(path).resolve()
    load_config(p)
    os.environ[CONFIG_ENV] = str(p)
    return p
