"""The models file of ``envace board``: which world models to score, each with its options.

    models:
      lookup: {reference: lookup}                      # a reference world model (lookup,
      edit:   {reference: edit}                        #   majority, edit), from the train split
      ranker: {ranker: true}                           # the learned ranker, fitted on train
      tiny:   {model: data/models/tiny-sft, memory_k: 3}
      hybrid: {model: data/models/tiny-sft, hybrid: true}
      served: {endpoint: "http://127.0.0.1:8000/v1#smollm2"}
      tiny-lk: {model: data/models/tiny-sft, score: likelihood}
      tiny-c: {model: data/models/tiny-sft, confidence: true}
      cut:    {endpoint: "http://127.0.0.1:8000/v1#tiny", tokenizer: data/models/tiny-sft}

Every reference, the ranker, ``memory_k`` and ``hybrid`` read the **train** split of the
environment the cell is scored on (never the split scored). ``score: likelihood`` asks for bits
per byte of the real response under a local model (``envace probe --likelihood``); a build
without it refuses the model with a clear error, before anything runs. ``confidence: true``
(a local model, generation scoring) scores each answer after its prompt, so the cell's audit has
the ``confidence`` block (``envace probe --confidence``). ``tokenizer`` (a served model): its
prompts are cut to ``context`` tokens (default: as a local model's, the tokenizer folder's SFT
``seq_len``, else 2048) exactly as the in-process probe cuts them and sent as token ids, so a
served cell asks what the same model's in-process cell asks and a long conversation is answered,
not refused; ``context`` on a local model overrides its prompt budget. A malformed file is one
:class:`envace.core.errors.UsageError` naming the model and the field.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from envace.core.errors import UsageError
from envace.core.infile import MAX_SMALL_BYTES, read_small_text
from envace.core.yaml_load import YamlError, load_yaml
from envace.model.windows import MIN_PROMPT

#: a model folder with more files than this is refused (``model: /`` would walk the disk)
MAX_MODEL_FILES = 10_000

REFERENCES = ("lookup", "majority", "edit")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class ModelSpec(BaseModel):
    """One world model of the board (exactly one of reference, ranker, model, endpoint)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    reference: Literal["lookup", "majority", "edit"] | None = None
    ranker: bool = False
    model: str | None = None  #: a local model folder, or ``smollm2``
    endpoint: str | None = None  #: ``URL#served-model-name``
    memory_k: int | None = Field(default=None, ge=1, le=64)
    hybrid: bool = False
    score: Literal["generation", "likelihood"] = "generation"
    max_new_tokens: int = Field(default=256, ge=1, le=8192)
    confidence: bool = False  #: each answer's mean token log-probability (a local model)
    #: a served model's tokenizer (a local folder or smollm2): its prompts are then cut to
    #: ``context`` as a local model's are and sent as token ids (`envace probe --tokenizer`)
    tokenizer: str | None = None
    context: int | None = Field(default=None, ge=64, le=1_000_000)  #: prompt budget in tokens

    @model_validator(mode="after")
    def _one_kind(self) -> ModelSpec:
        kinds = [k for k, on in (("reference", self.reference is not None),
                                 ("ranker", self.ranker), ("model", self.model is not None),
                                 ("endpoint", self.endpoint is not None)) if on]
        if len(kinds) != 1:
            raise ValueError("give exactly one of reference, ranker, model, endpoint"
                             + (f" (got {', '.join(kinds)})" if kinds else ""))
        if kinds[0] in ("reference", "ranker"):
            extra = [f for f in ("memory_k", "hybrid") if getattr(self, f)]
            if extra or self.score != "generation":
                raise ValueError(f"{kinds[0]} generates nothing: no "
                                 f"{', '.join(extra) or 'score: likelihood'}")
        if self.confidence and (kinds[0] != "model" or self.score != "generation"):
            raise ValueError("confidence: true needs a local model that generates (model: "
                             "..., score: generation): it scores the answers with the model")
        if self.tokenizer is not None and kinds[0] != "endpoint":
            raise ValueError("tokenizer is a served model's (endpoint: ...); a local model's is "
                             "in its folder")
        if self.context is not None and kinds[0] not in ("model", "endpoint"):
            raise ValueError(f"context cuts a model's prompts: not for a {kinds[0]}")
        if self.context is not None and self.score == "generation" \
                and self.context < self.max_new_tokens + MIN_PROMPT:
            raise ValueError(f"context {self.context} leaves no room for a prompt: at least "
                             f"max_new_tokens + {MIN_PROMPT} "
                             f"({self.max_new_tokens + MIN_PROMPT})")
        if self.context is not None and kinds[0] == "endpoint" and self.tokenizer is None:
            raise ValueError("context on a served model needs its tokenizer (tokenizer: PATH): "
                             "the prompts are cut in tokens")
        if self.endpoint is not None and "#" not in self.endpoint:
            raise ValueError("endpoint is URL#model (the served model's name after '#')")
        return self

    @property
    def kind(self) -> str:
        return ("reference" if self.reference else "ranker" if self.ranker
                else "model" if self.model else "endpoint")

    def given(self) -> dict[str, Any]:
        """The spec as written (defaults left out): what the board records and hashes."""
        return self.model_dump(exclude_defaults=True)


def parse_models(data: Any, where: str = "models file") -> dict[str, ModelSpec]:
    """``{"models": {name: spec}}`` (decoded YAML) as specs; UsageError naming what is wrong."""
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict) or not data["models"]:
        raise UsageError(f"{where}: expected a mapping `models:` of name -> options "
                         "(e.g. `lookup: {reference: lookup}`)")
    out: dict[str, ModelSpec] = {}
    for name, spec in data["models"].items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise UsageError(f"{where}: model name {name!r}: letters, digits, '.', '_', '-' "
                             "(it names the cell's directory)")
        if not isinstance(spec, dict):
            raise UsageError(f"{where}: model {name!r}: expected a mapping of options")
        try:
            out[name] = ModelSpec.model_validate(spec)
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            loc = ".".join(str(x) for x in err["loc"])
            raise UsageError(f"{where}: model {name!r}: {loc + ': ' if loc else ''}"
                             f"{err['msg'].removeprefix('Value error, ')}") from None
    return out


def read_models(path: str | os.PathLike[str]) -> dict[str, ModelSpec]:
    """The models of a YAML file (see the module docstring)."""
    text = read_small_text(path, MAX_SMALL_BYTES, "--models")
    try:
        data = load_yaml(text, f"--models {path}")
    except YamlError as exc:  # not YAML, nested too deeply, a model named twice
        raise UsageError(str(exc)) from None
    return parse_models(data, str(path))


def file_hash(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes (16 hex digits)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def folder_fingerprint(path: str | os.PathLike[str]) -> str | None:
    """Names, sizes and modification times of a model folder's files (a retrained model in
    the same folder invalidates its cells); None for a name that is not a folder (smollm2)."""
    p = Path(path)
    if not p.is_dir():
        return None
    rows = []
    for f in p.rglob("*"):  # OSError for a folder that cannot be listed: the cell fails
        if len(rows) >= MAX_MODEL_FILES:
            raise ValueError(f"model folder {path} holds more than {MAX_MODEL_FILES} files: "
                             "not a model folder")
        st = f.lstat()
        if stat.S_ISREG(st.st_mode):
            rows.append((str(f.relative_to(p)), st.st_size, st.st_mtime_ns))
    return hashlib.sha256(json.dumps(sorted(rows)).encode()).hexdigest()[:16]


def uses_history(spec: ModelSpec) -> bool:
    """Whether ``envace board --history both`` changes this model's cell: a model that
    generates (a local one or an endpoint) is probed with both histories; a reference, the
    ranker and a likelihood cell (which scores the real responses given the real history)
    are not, and their keys do not hold the option."""
    return spec.kind in ("model", "endpoint") and spec.score == "generation"


def cell_key(spec: ModelSpec, env: str, split: str, inputs: dict[str, str],
             options: dict[str, Any]) -> str:
    """What makes a finished cell reusable: the model's spec (and its folder's files, or a
    served model's tokenizer folder's), the
    environment, the split, the hashes of the input files the cell reads and the board's
    options. Any change gives another key: exactly the cells it touches are recomputed."""
    record = {"board": 1, "spec": spec.given(), "env": env, "split": split,
              "inputs": inputs, "options": options,
              "model_files": folder_fingerprint(spec.model) if spec.model else None}
    if spec.tokenizer:  # a served model's tokenizer cuts its prompts (older keys unchanged)
        record["tokenizer_files"] = folder_fingerprint(spec.tokenizer)
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]
