"""Shared test fixtures: the project root, the spec's example files, small real splits, the
train split's memory of real responses, and `play` (scripted text through the rollout engine).

The examples of ``docs/spec/trajectory.md`` live in ``tests/data/spec_examples`` (the project's
own copy), so a fresh clone runs every test that reads them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "docs" / "spec"
EXAMPLES = ROOT / "tests" / "data" / "spec_examples"


@pytest.fixture(scope="session")
def examples() -> Path:
    assert EXAMPLES.exists(), f"spec examples missing at {EXAMPLES}"
    return EXAMPLES


@pytest.fixture(scope="session")
def small_real_files(tmp_path_factory) -> dict[str, Path]:
    """Real trajectories (ground truth executed) of the first 40 train and 4 dev tasks, as
    ``{"train": path, "dev": path}`` JSONL files."""
    from envace.core.envs.bfcl.tasks import split_tasks
    from envace.core.export import export_real
    from envace.core.schema import TrajectoryWriter

    d = tmp_path_factory.mktemp("small_real")
    paths = {}
    for name, tasks in (("train", split_tasks("train")[:40]), ("dev", split_tasks("dev")[:4])):
        paths[name] = d / f"{name}.jsonl"
        with TrajectoryWriter(paths[name], mode="w") as w:
            for t in export_real(tasks):
                w.write(t)
    return paths


@pytest.fixture(scope="session")
def train_memory():
    """The BFCL train split's memory of real responses (`audit.worlds.memory.ResponseMemory`)."""
    from audit.worlds.memory import ResponseMemory
    from envace.core.envs.bfcl.tasks import split_tasks
    from envace.core.export import export_real

    return ResponseMemory.from_trajectories(export_real(split_tasks("train")), "train split")


def play(eng, row, text: str, kind: str | None = None) -> None:
    """Play ``text`` as the model's next message through the engine's own state machine (no
    sampling): ``kind`` ``act`` or ``rehearse`` (None: the kind the row is already in)."""
    from envace.model import chat

    if kind is not None:
        row.gen = kind
    row.queue.clear()
    row.buf = chat.encode_text(eng.tok, text) + [eng.im_end]
    eng.finish_message(row)
