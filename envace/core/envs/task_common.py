"""What every environment family's tasks share: the data folder, the unknown-task error and
the ground-truth call record.

    from envace.core.envs.task_common import DATA_DIR, GroundTruthCall, UnknownTask
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parents[3] / "data"


class UnknownTask(KeyError):
    """A task id that is not in the registry."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class GroundTruthCall:
    """One ground-truth call: BFCL's source string and its parsed form."""

    source: str
    name: str
    args: tuple[Any, ...]  # positional literals, as written
    kwargs: dict[str, Any]
