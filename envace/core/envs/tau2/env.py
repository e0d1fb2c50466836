"""τ²-bench's domains as an envace environment (``make_env("tau2")``), through tau2's own code.

A reset builds tau2's ``Environment`` with ``tau2.domains.<d>.environment.get_environment`` on
pristine databases (loaded from disk once per process; after that the adapter's used ones are put
back in place, ``db.py``: far cheaper than tau2's reload or a deep copy) and applies the task's
initial state as tau2 does,
``env.set_state(initialization_data, initialization_actions, message_history)``. A call is
``env.get_response(ToolCall(...))``, tau2's own step: the response is its ``ToolMessage``
content (``Environment.to_json_str`` of the return value, or ``"Error: ..."`` with ``error``
set). So an unknown tool answers tau2's ``Error: Tool 'x' not found.``, and an argument the
Python method does not take answers ``Error: <Tools>.<tool>() got an unexpected keyword argument
'x'`` (tau2 passes arguments straight to Python): error results, never exceptions. Telecom runs in
tau2's solo mode: the agent's tools and the user's phone tools in one list.

Deterministic: airline's clock and new ids are fixed in tau2's code; telecom's one-time charges
name a new bill ``B{uuid4().hex[:8]}``, so while this adapter runs a call ``uuid4`` draws from a
generator seeded at each reset (:class:`IdSource`): the same bill ids in every run and process.

Hazard: airline's and retail's ``calculate`` evaluates an arithmetic string (digits and
``+-*/(). `` only, so ``9**9**9`` passes its check and runs until killed). Nothing here limits a
call's time: the per-call wall-clock limit of the audit (``--call-timeout``, a child process) is
what cuts it.

The state is both databases' ``model_dump(mode="json")``; ``state_hash`` is made from tau2's own
DB hashes (``get_db_hash``, ``get_user_db_hash``: sha256 of the sorted JSON dump).

    env = make_env("tau2")
    env.reset("airline/0")
    env.execute("get_reservation_details", {"reservation_id": "EHGLP3"})
"""

from __future__ import annotations

import contextlib
import random
import threading
import uuid
from collections.abc import Iterator
from functools import cache
from typing import Any

from envace.core.envs.base import ToolKind, ToolResult, hash_state, register_env
from envace.core.envs.tau2.domain import (
    ALL_DOMAINS,
    DOMAINS,
    build_environment,
    domain_tools,
    fresh_dbs,
    restorers,
    tau2_module,
    tool_kinds,
)
from envace.core.envs.tau2.tasks import TAU2Task, get_task, load_tasks

ID_SEED = 0


class IdSource:
    """The ``uuid4`` a tau2 tool sees while a call runs: version-4 UUIDs from a seeded generator
    (one per reset), so new bill ids repeat across runs and processes."""

    def __init__(self, seed: int = ID_SEED) -> None:
        self._rng = random.Random(seed)

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(int=self._rng.getrandbits(128), version=4)


_ACTIVE = threading.local()


class _UUIDModule:
    """Stands in for the ``uuid`` module inside tau2's telecom tools: ``uuid4`` draws from the
    active :class:`IdSource` (the real one outside an adapter call); the rest is ``uuid``."""

    def uuid4(self) -> uuid.UUID:
        source = getattr(_ACTIVE, "source", None)
        return source.uuid4() if source is not None else uuid.uuid4()

    def __getattr__(self, name: str) -> Any:
        return getattr(uuid, name)


@contextlib.contextmanager
def ids_from(source: IdSource) -> Iterator[None]:
    """While active (this thread): tau2's telecom tools draw new ids from ``source``."""
    _freeze_ids()
    before = getattr(_ACTIVE, "source", None)
    _ACTIVE.source = source
    try:
        yield
    finally:
        _ACTIVE.source = before


def new_ids() -> None:
    """Inside :func:`ids_from`: start drawing from a fresh source (as after a reset)."""
    _ACTIVE.source = IdSource()


@cache
def _freeze_ids() -> None:
    tools = tau2_module("tau2.domains.telecom.tools")
    if tools.uuid is uuid:
        tools.uuid = _UUIDModule()


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> Any:
    """tau2's ``ToolCall`` (requestor ``assistant``: in solo mode tau2 routes user tools)."""
    ToolCall = tau2_module("tau2.data_model.message").ToolCall
    return ToolCall(id=call_id, name=name, arguments=arguments, requestor="assistant")


def apply_initial_state(env: Any, task: Any) -> None:
    """The task's initial state, as tau2's evaluators apply it (``Environment.set_state``)."""
    init = task.initial_state
    env.set_state(
        initialization_data=init.initialization_data if init is not None else None,
        initialization_actions=init.initialization_actions if init is not None else None,
        message_history=(init.message_history or []) if init is not None else [],
    )


@register_env("tau2")
class TAU2Env:
    """One τ² domain environment, reset from a task (or an inline state)."""

    name = "tau2"

    def __init__(self) -> None:
        self.domain: str | None = None
        self.task: TAU2Task | None = None
        self.environment: Any = None  # tau2's Environment
        self.ids = IdSource()
        self.calls = 0

    # -- setup -----------------------------------------------------------------------------
    def reset(self, task: TAU2Task | str | dict[str, Any]) -> None:
        """Load a task's initial state: a TAU2Task, a task id, or a dict: ``{"task": id}`` or an
        inline state ``{"domain": d}`` (the pristine databases) with optional ``"db"`` and
        ``"user_db"`` (``model_dump(mode="json")`` of tau2's databases)."""
        if isinstance(task, dict):
            if "task" in task:
                task = get_task(task["task"])
            else:
                self._reset_inline(task)
                return
        if isinstance(task, str):
            task = get_task(task)
        if not isinstance(task, TAU2Task):
            raise TypeError(f"cannot reset tau2 from {type(task).__name__}")
        self.ids = IdSource()
        env = build_environment(task.domain, dbs=self._used(task.domain))
        with ids_from(self.ids):
            apply_initial_state(env, task.tau2_task())
        self._load(task.domain, env)
        self.task = task

    def reset_record(self, record: dict[str, Any]) -> None:
        """Reset from a trajectory's ``env`` record (``task``, or ``state``)."""
        self.reset({"task": record["task"]} if "task" in record else record["state"])

    def _reset_inline(self, state: dict[str, Any]) -> None:
        domain = state.get("domain")
        if domain not in ALL_DOMAINS:
            raise ValueError(f"inline state needs 'domain': one of {', '.join(ALL_DOMAINS)}")
        self.ids = IdSource()
        env = build_environment(domain, dbs=self._used(domain))
        if "db" in state:
            env.tools.db = type(env.tools.db).model_validate(state["db"])
        if state.get("user_db") is not None and env.user_tools is not None:
            env.user_tools.db = type(env.user_tools.db).model_validate(state["user_db"])
        with ids_from(self.ids):
            env.sync_tools()
        self._load(domain, env)
        self.task = None

    def _used(self, domain: str) -> tuple[Any, Any]:
        """Pristine databases for the domain: this adapter's own put back in place when they
        are the domain's, else fresh copies."""
        env = self.environment
        if env is None or restorers(self.domain)[0] is not restorers(domain)[0]:
            return fresh_dbs(domain)
        return fresh_dbs(domain, (env.tools.db,
                                  env.user_tools.db if env.user_tools is not None else None))

    def _load(self, domain: str, env: Any) -> None:
        self.domain = domain
        self.environment = env
        self.calls = 0

    # -- catalogue (optional protocol methods: `envace envs`, export) ------------------------
    def task_ids(self) -> list[str]:
        return [i for d in DOMAINS for i in load_tasks(d)]

    def all_tools(self) -> list[dict[str, Any]]:
        return [s for d in DOMAINS for s in domain_tools(d)]

    def task_prompt(self, task_id: str) -> str:
        return get_task(task_id).prompt

    def ground_truth(self, task_id: str) -> list[tuple[str, dict[str, Any]]]:
        return get_task(task_id).calls()

    # -- protocol --------------------------------------------------------------------------
    def tools(self) -> list[dict[str, Any]]:
        return domain_tools(self.domain) if self.domain is not None else []

    def tool_names(self) -> set[str]:
        return set(tool_kinds(self.domain)) if self.domain is not None else set()

    def tool_kind(self, tool: str) -> ToolKind | None:
        if self.domain is not None:
            return tool_kinds(self.domain).get(tool)
        found = {tool_kinds(d)[tool] for d in DOMAINS if tool in tool_kinds(d)}
        return found.pop() if len(found) == 1 else None

    def execute(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        """tau2's own step for one call; what tau2 answers as an error is an error result."""
        if self.environment is None:
            raise RuntimeError("reset() the environment before execute()")
        self.calls += 1
        if not isinstance(tool, str) or not tool:
            return ToolResult(f"Error: Tool {str(tool)[:100]!r} not found.", True)
        if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments):
            return ToolResult("Error: arguments must be an object with string keys", True)
        try:
            call = tool_call(f"c{self.calls}", tool, arguments)
            with ids_from(self.ids):
                msg = self.environment.get_response(call)
        except Exception as exc:  # tau2 catches the tool's own; this is a failure around it
            return ToolResult(f"Error: {type(exc).__name__}: {exc}", True)
        return ToolResult(str(msg.content), bool(msg.error))

    def state(self) -> dict[str, Any]:
        if self.environment is None:
            return {}
        env = self.environment
        user = env.user_tools.db.model_dump(mode="json") if env.user_tools is not None else None
        return {"domain": self.domain, "db": env.tools.db.model_dump(mode="json"),
                "user_db": user}

    def state_hash(self) -> str:
        """16 hex digits made from tau2's own DB hashes (agent's and user's)."""
        if self.environment is None:
            return hash_state({})
        env = self.environment
        return hash_state({"domain": self.domain, "db": env.get_db_hash(),
                           "user_db": env.get_user_db_hash()})
