"""BFCL v4 multi-turn tasks (800, shipped in the `bfcl-eval` package) and the fixed splits.

A task holds its initial backend state, its user turns, its ground-truth calls per turn (BFCL's
Python call strings, parsed into name + keyword arguments without evaluating anything), the
functions excluded from it and those withheld until a later turn (miss_func), and tool schemas
converted from BFCL's function docs to the OpenAI/HF function format.

The four categories (base, miss_func, miss_param, long_context) are variants of the same 200
scenarios; splits are by scenario (``data/splits/*.txt``, made by ``scripts/make_splits.py``).

    tasks = load_tasks()                  # {task id: Task}, 800 of them
    dev = split_tasks("dev")              # the dev split's tasks, in file order
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from envace.core.envs.bfcl.callparse import parse_call_source
from envace.core.envs.task_common import DATA_DIR, GroundTruthCall, TaskRecord, UnknownTask

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
BACKENDS = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)
SPLITS = ("train", "dev", "test")

def tools_added_message(names: list[str]) -> dict[str, str]:
    """The system message of a miss_func turn that restores withheld tools."""
    return {"role": "system", "content": "New tools available: " + ", ".join(names) + "."}


@dataclass
class Task(TaskRecord):
    """A BFCL multi-turn task."""

    id: str
    category: str
    scenario: int
    involved_classes: list[str]
    initial_config: dict[str, Any]
    turns: list[list[dict[str, str]]]  # user messages per turn ([] where a turn only adds tools)
    ground_truth: list[list[GroundTruthCall]]
    excluded_functions: list[str] = field(default_factory=list)
    missed_functions: dict[int, list[str]] = field(default_factory=dict)  # turn -> names
    env_name: str = "bfcl"
    # A per-turn task (bfcl/turns.py) starts after earlier turns of a base task were done right:
    base_id: str | None = None  # the task whose initial state it starts from
    history: list[dict[str, Any]] = field(default_factory=list)  # messages of earlier turns
    prefix: list[list[GroundTruthCall]] = field(default_factory=list)  # their ground truth

    @property
    def long_context(self) -> bool:
        return self.category == "long_context"

    def turn_messages(self, turn: int) -> list[dict[str, str]]:
        """What opens turn ``turn``: the "new tools available" message where the turn restores
        withheld tools, then the turn's user messages."""
        added = self.missed_functions.get(turn)
        return ([tools_added_message(added)] if added else []) + [dict(m) for m in self.turns[turn]]

    def opening_messages(self) -> list[dict[str, Any]]:
        """The prompt of an episode: earlier turns (a per-turn task's history), then turn 0."""
        return [*self.history, *(self.turn_messages(0) if self.turns else [])]

    @property
    def primary_backend(self) -> str:
        return self.involved_classes[0]

    def tools(self, turn: int | None = None) -> list[dict[str, Any]]:
        """Tool schemas offered (all turns when ``turn`` is None; else those available by then)."""
        hidden = set(self.excluded_functions)
        if turn is not None:
            for t, names in self.missed_functions.items():
                if t > turn:
                    hidden.update(names)
        return [
            s
            for c in self.involved_classes
            for s in function_docs()[c]
            if s["function"]["name"] not in hidden
        ]


def bfcl_data_dir() -> Path:
    spec = find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("bfcl-eval is not installed: run `bash scripts/setup.sh`")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


_TYPE_MAP = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


def _convert_schema(node: Any) -> Any:
    """BFCL's parameter schema (types 'dict', 'float', 'tuple', 'any') as JSON Schema."""
    if isinstance(node, dict):
        out = {k: _convert_schema(v) for k, v in node.items()}
        if isinstance(out.get("type"), str):
            out["type"] = _TYPE_MAP.get(out["type"], out["type"])
        return out
    if isinstance(node, list):
        return [_convert_schema(v) for v in node]
    return node


@lru_cache(maxsize=1)
def function_docs() -> dict[str, list[dict[str, Any]]]:
    """Tool schemas per backend class, OpenAI/HF function format, from BFCL's function docs."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    out: dict[str, list[dict[str, Any]]] = {}
    for cls in BACKENDS:
        path = bfcl_data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls]
        docs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        out[cls] = [
            {
                "type": "function",
                "function": {
                    "name": d["name"],
                    "description": d.get("description", ""),
                    "parameters": _convert_schema(d.get("parameters", {"type": "object"})),
                },
            }
            for d in docs
        ]
    return out


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@lru_cache(maxsize=1)
def load_tasks() -> dict[str, Task]:
    """All 800 BFCL v4 multi-turn tasks by id."""
    root = bfcl_data_dir()
    tasks: dict[str, Task] = {}
    for cat in CATEGORIES:
        entries = _read_jsonl(root / f"BFCL_v4_multi_turn_{cat}.json")
        answers = {
            a["id"]: a["ground_truth"]
            for a in _read_jsonl(root / "possible_answer" / f"BFCL_v4_multi_turn_{cat}.json")
        }
        for e in entries:
            gt = []
            for turn in answers[e["id"]]:
                calls = []
                for src in turn:
                    name, args, kwargs = parse_call_source(src)
                    calls.append(GroundTruthCall(src, name, tuple(args), kwargs))
                gt.append(calls)
            tasks[e["id"]] = Task(
                id=e["id"],
                category=cat,
                scenario=int(e["id"].rsplit("_", 1)[1]),
                involved_classes=list(e["involved_classes"]),
                initial_config=e.get("initial_config", {}),
                turns=[list(t) for t in e["question"]],
                ground_truth=gt,
                excluded_functions=list(e.get("excluded_function", [])),
                missed_functions={int(k): list(v) for k, v in e.get("missed_function", {}).items()},
            )
    return tasks


def get_task(task_id: str) -> Task:
    tasks = load_tasks()
    if task_id not in tasks:
        raise UnknownTask(
            f"unknown task id {task_id!r}: BFCL multi-turn ids look like multi_turn_base_17 "
            f"(categories: {', '.join(CATEGORIES)}; scenarios 0-199)"
        )
    return tasks[task_id]


def split_ids(split: str) -> list[str]:
    """Task ids of a committed split (``data/splits/<split>.txt``)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    path = DATA_DIR / "splits" / f"{split}.txt"
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def split_tasks(split: str, categories: tuple[str, ...] = CATEGORIES) -> list[Task]:
    tasks = load_tasks()
    return [tasks[i] for i in split_ids(split) if tasks[i].category in categories]
