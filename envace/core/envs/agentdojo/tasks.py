"""AgentDojo's user tasks (the `agentdojo` package, MIT) as envace task records, and its world.

AgentDojo has four suites of stateful Python tools (workspace, travel, banking, slack) and, in
benchmark version v1.2.2, 97 user tasks whose ground-truth calls run without a model. A task id is
``"<suite>/user_task_<n>"``; the benchmark version travels with the task record (default v1.2.2).
Injection tasks and attack texts are not used: environments load with their injection slots
filled by agentdojo's harmless defaults.

As shipped, agentdojo is not deterministic: ``send_email``, ``create_file`` and
``append_to_file`` stamp the real clock into the state (the suites' world is 2024-05-15), and
``create_calendar_event`` orders participants through a ``set`` (the order depends on the hash
seed). :func:`deterministic_world` fixes both while a tool runs: the clock of the two tool modules
reads 2024-05-15 12:00:00 and the participant list keeps first-appearance order.

    tasks = load_tasks()                          # {task id: AgentDojoTask}, 97 in v1.2.2
    task = get_task("workspace/user_task_0")
    task.prompt, task.ground_truth[0][0].name     # the user's request, its first call
    split_tasks("dev")                            # the committed dev split (data/splits/agentdojo)

Importing this module does not import agentdojo (which imports four LLM API clients, ~2 s).
"""

from __future__ import annotations

import datetime
import json
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from envace.core.envs.task_common import (
    DATA_DIR,
    GroundTruthCall,
    TaskRecord,
    UnknownTask,
    format_call,
)

SUITES = ("workspace", "travel", "banking", "slack")
DEFAULT_VERSION = "v1.2.2"
SPLITS = ("train", "dev", "test")
SPLIT_DIR = DATA_DIR / "splits" / "agentdojo"
FROZEN_NOW = datetime.datetime(2024, 5, 15, 12, 0, 0)
_TOOL_MODULES = "agentdojo.default_suites.v1.tools."


def _agentdojo() -> Any:
    try:
        from agentdojo.task_suite import load_suites
    except ImportError as exc:
        raise RuntimeError(
            f"agentdojo is not importable ({exc}): run `bash scripts/setup.sh`"
        ) from None
    return load_suites


def versions() -> list[str]:
    """Benchmark versions the installed agentdojo knows (``v1`` ... ``v1.2.2``)."""
    return sorted(_agentdojo()._SUITES)


@cache
def suites(version: str = DEFAULT_VERSION) -> dict[str, Any]:
    """agentdojo's TaskSuite objects of a benchmark version, by suite name."""
    known = versions()
    if version not in known:
        raise ValueError(f"unknown AgentDojo version {version!r}; known: {', '.join(known)}")
    return dict(_agentdojo().get_suites(version))


def suite_of(task_id: str) -> tuple[str, str]:
    """(suite, user task name) of an id ``"<suite>/user_task_<n>"``; UnknownTask otherwise."""
    suite, _, name = str(task_id).partition("/")
    if suite not in SUITES or not name.startswith("user_task_"):
        raise UnknownTask(
            f"unknown AgentDojo task id {task_id!r}: ids look like workspace/user_task_0 "
            f"(suites: {', '.join(SUITES)})"
        )
    return suite, name


# -- a deterministic world -------------------------------------------------------------------
class _FrozenDatetime(datetime.datetime):
    """``datetime.datetime`` whose ``now()`` is the suites' present (a plain datetime)."""

    @classmethod
    def now(cls, tz: datetime.tzinfo | None = None) -> datetime.datetime:  # type: ignore[override]
        return FROZEN_NOW if tz is None else FROZEN_NOW.replace(tzinfo=tz)


_CLOCK = types.ModuleType("datetime")
_CLOCK.__dict__.update({k: v for k, v in vars(datetime).items() if not k.startswith("__")})
_CLOCK.datetime = _FrozenDatetime  # type: ignore[attr-defined]


def _ordered_set(items: Any = ()) -> dict[Any, None]:
    """Stands in for ``set`` in the calendar module: dedupes keeping first-appearance order."""
    return dict.fromkeys(items)


_LOCK = threading.RLock()
_depth = 0


@contextmanager
def deterministic_world() -> Iterator[None]:
    """While active: agentdojo's email and cloud-drive tools read 2024-05-15 12:00:00 as now, and
    ``create_calendar_event`` orders participants by first appearance (re-entrant)."""
    global _depth
    import importlib

    mods = {n: importlib.import_module(_TOOL_MODULES + n)
            for n in ("email_client", "cloud_drive_client", "calendar_client")}
    with _LOCK:
        if _depth == 0:
            mods["email_client"].datetime = _CLOCK
            mods["cloud_drive_client"].datetime = _CLOCK
            mods["calendar_client"].set = _ordered_set
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
            if _depth == 0:
                mods["email_client"].datetime = datetime
                mods["cloud_drive_client"].datetime = datetime
                del mods["calendar_client"].set


# -- environments, tools, tasks -------------------------------------------------------------
@cache
def _default_environment(version: str, suite: str) -> Any:
    with deterministic_world():
        return suites(version)[suite].load_and_inject_default_environment({})


def default_environment(version: str, suite: str) -> Any:
    """A fresh copy of a suite's environment with agentdojo's default injection texts."""
    return _default_environment(version, suite).model_copy(deep=True)


def function_schema(function: Any) -> dict[str, Any]:
    """An agentdojo Function in the OpenAI/HF function format (as agentdojo's OpenAI client
    sends it: name, description, the pydantic input model's JSON schema)."""
    return {
        "type": "function",
        "function": {
            "name": function.name,
            "description": function.description,
            "parameters": function.parameters.model_json_schema(),
        },
    }


@cache
def _suite_schemas(version: str, suite: str) -> tuple[str, ...]:
    return tuple(json.dumps(function_schema(f)) for f in suites(version)[suite].tools)


def suite_tools(suite: str, version: str = DEFAULT_VERSION) -> list[dict[str, Any]]:
    """The tool schemas of a suite (fresh dicts)."""
    return [json.loads(s) for s in _suite_schemas(version, suite)]


@dataclass
class AgentDojoTask(TaskRecord):
    """One AgentDojo user task: one user turn, its ground-truth calls, the expected answer.

    Shaped like :class:`envace.core.envs.bfcl.tasks.Task` where export, replay, rollout and eval
    need it (``turns``, ``ground_truth`` per turn, ``turn_messages``, ``opening_messages``,
    ``tools``,
    ``base_id``, ``history``, ``primary_backend``).
    """

    id: str
    suite: str
    version: str
    prompt: str
    ground_truth: list[list[GroundTruthCall]]  # one turn
    ground_truth_output: str = ""
    difficulty: str = "EASY"
    env_name: str = "agentdojo"
    turns: list[list[dict[str, str]]] = field(default_factory=list)
    # shaped like a BFCL Task for the rollout engine: never a per-turn task, so no earlier turns
    base_id: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.turns:
            self.turns = [[{"role": "user", "content": self.prompt}]]

    @property
    def category(self) -> str:
        return self.suite

    @property
    def primary_backend(self) -> str:
        """What evaluation groups success by (BFCL: the first backend class): the suite."""
        return self.suite

    @property
    def number(self) -> int:
        return int(self.id.rsplit("_", 1)[1])

    def tools(self, turn: int | None = None) -> list[dict[str, Any]]:
        return suite_tools(self.suite, self.version)

    def user_task(self) -> Any:
        """agentdojo's own BaseUserTask object."""
        return suites(self.version)[self.suite].user_tasks[self.id.split("/", 1)[1]]


def _make_task(version: str, suite: str, name: str, user_task: Any) -> AgentDojoTask:
    env = user_task.init_environment(default_environment(version, suite))
    calls = []
    for fc in user_task.ground_truth(env.model_copy(deep=True)):
        kwargs = json.loads(json.dumps(dict(fc.args)))  # plain JSON data, as a trajectory holds it
        calls.append(GroundTruthCall(format_call(fc.function, kwargs), fc.function, (), kwargs))
    return AgentDojoTask(
        id=f"{suite}/{name}",
        suite=suite,
        version=version,
        prompt=user_task.PROMPT,
        ground_truth=[calls],
        ground_truth_output=str(user_task.GROUND_TRUTH_OUTPUT or ""),
        difficulty=user_task.DIFFICULTY.name,
    )


@cache
def load_tasks(version: str = DEFAULT_VERSION) -> dict[str, AgentDojoTask]:
    """Every user task of a benchmark version by id, suites in order, tasks by number."""
    out: dict[str, AgentDojoTask] = {}
    with deterministic_world():
        for suite in SUITES:
            tasks = suites(version)[suite].user_tasks
            for name in sorted(tasks, key=lambda n: int(n.rsplit("_", 1)[1])):
                task = _make_task(version, suite, name, tasks[name])
                out[task.id] = task
    return out


def get_task(task_id: str, version: str = DEFAULT_VERSION) -> AgentDojoTask:
    suite, name = suite_of(task_id)
    tasks = load_tasks(version)
    if task_id not in tasks:
        n = sum(t.suite == suite for t in tasks.values())
        raise UnknownTask(f"unknown AgentDojo task {task_id!r}: {suite} has {n} user tasks in "
                          f"{version} (user_task_0 ... )")
    return tasks[task_id]


def split_ids(split: str) -> list[str]:
    """Task ids of a committed split (``data/splits/agentdojo/<split>.txt``); ``all``: every
    user task of the default version."""
    if split == "all":
        return list(load_tasks())
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of all, {', '.join(SPLITS)}")
    path = SPLIT_DIR / f"{split}.txt"
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def split_tasks(split: str, version: str = DEFAULT_VERSION) -> list[AgentDojoTask]:
    tasks = load_tasks(version)
    return [tasks[i] for i in split_ids(split) if i in tasks]
