"""The probe's kept KV caches (`envace.model.kept_prompts`) answer as the per-step path does.

On the tiny model (fp32, one thread), greedy: the probe of real BFCL dev trajectories with each
trajectory's cache kept across its calls writes the same step rows as the probe that encodes
every prompt from scratch (`model_answers`), with both histories and with a context so short
that most prompts are cut (the window moves, so the kept prefix matches only up to the cut),
while it encodes far fewer prompt tokens. The engine alone: the same continuations as
`generate_greedy` when a prompt drops the previous answer, diverges from the kept ids in its
middle, or shrinks; keys missing from a call are dropped.
"""

from __future__ import annotations

import json

import pytest

from audit.probe import run_probe
from audit.scoring.settings import AuditOptions
from envace.model.chat import IM_END

TINY = "data/models/tiny-sft"
LIMIT = 3  # dev trajectories probed (2 conversations at once: later ones start as others end)


@pytest.fixture(scope="module")
def tiny():
    import torch

    from envace.model.models import load_model

    torch.set_num_threads(1)
    return load_model(TINY)


def _rows(out) -> list[dict]:
    rows = [json.loads(line) for line in (out / "steps.jsonl").open()]
    for r in rows:  # the only per-run field: wall time, if any
        r.pop("seconds", None)
    return rows


@pytest.mark.parametrize("context", [2048, 420])
def test_kept_probe_writes_the_per_step_probes_rows(tiny, small_real_files, tmp_path, context):
    from envace.evaluation.model_probe import kept_answers, model_answers

    model, tok = tiny
    dev = [str(small_real_files["dev"])]
    opts = AuditOptions(progress=False)
    kept = kept_answers(model, tok, context, max_new_tokens=40, batch_size=3)
    run_probe(dev, tmp_path / "kept", None, opts, LIMIT, histories=("real", "own"),
              answer_batch=kept, chunk=2)
    run_probe(dev, tmp_path / "step", None, opts, LIMIT, histories=("real", "own"),
              answer_batch=model_answers(model, tok, context, 40, batch_size=3))
    a, b = _rows(tmp_path / "kept"), _rows(tmp_path / "step")
    assert len(a) == len(b) > 10
    assert [r["rehearsed"] for r in a] == [r["rehearsed"] for r in b]
    assert a == b
    engine = kept.kept  # type: ignore[attr-defined]
    assert engine.kept == {}  # every trajectory ended, every cache was dropped
    if context == 2048:  # nothing is cut: most of every prompt came from a kept cache
        assert engine.reused > 2 * engine.encoded
    else:  # windows move (BFCL prompts are ~1,000 tokens): the system turn is still reused
        assert engine.reused > 0


def test_engine_matches_generate_greedy_when_prompts_change(tiny):
    from envace.evaluation.model_probe import generate_greedy
    from envace.model.kept_prompts import KeptPrompts

    model, tok = tiny
    stop = tok.convert_tokens_to_ids(IM_END)
    kept = KeptPrompts(model, tok.pad_token_id, stop, batch_size=2)
    text = [tok.encode(f"<|im_start|>user\nsay {w} to the tool<|im_end|>\n<|im_start|>tool\n")
            for w in ("hello", "goodbye again", "x")]
    a, b, c = text
    rounds = [
        {"a": a, "b": b, "c": c},
        {"a": a + b, "b": b + a[:-3] + c, "c": c + c},  # appended; b diverges inside
        {"a": a[:5] + c, "c": c},  # a shrinks and diverges early, c is a prefix; b is dropped
    ]
    for prompts in rounds:
        keys = list(prompts)
        got = kept.generate(keys, [prompts[k] for k in keys], max_new_tokens=12)
        want = generate_greedy(model, tok, [prompts[k] for k in keys], 12, batch_size=1)
        assert [tok.decode(g, skip_special_tokens=False) for g in got] == want
        assert set(kept.kept) == set(keys)
        for k, g in zip(keys, got, strict=True):  # kept: the prompt and the answer it fed
            held = kept.kept[k]
            assert held.ids[:len(prompts[k])] == prompts[k]
            assert len(held.ids) in (len(prompts[k]) + len(g), len(prompts[k]) + 11)
            _same_cache_as_one_forward(model, held)
    with pytest.raises(ValueError, match="distinct"):
        kept.generate(["a", "a"], [a, a], 4)


def _same_cache_as_one_forward(model, held) -> None:
    """The kept keys and values are those of encoding the kept ids in one forward."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([held.ids]), use_cache=True)
    layers = out.past_key_values.layers
    assert len(layers) == len(held.layers)
    for layer, (k, v) in zip(layers, held.layers, strict=True):
        torch.testing.assert_close(k, layer.keys[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(v, layer.values[0], atol=1e-4, rtol=1e-4)


def test_finished_rows_leave_the_batch_and_waiting_keys_take_their_place(tiny):
    """Continuous batching: each answer's rows appear in exactly as many decode forwards as it
    has tokens after its first; forwards waste rows only in the last batch's tail (never while
    keys wait); answers equal `generate_greedy`'s one prompt at a time."""
    import math

    from envace.evaluation.model_probe import generate_greedy
    from envace.model.kept_prompts import KeptPrompts

    model, tok = tiny
    stop = tok.convert_tokens_to_ids(IM_END)
    batch, limit = 2, 10
    kept = KeptPrompts(model, tok.pad_token_id, stop, batch_size=batch)
    words = ("hello", "goodbye again", "x", "the weather in Paris", "ls -la", "{}", "42")
    prompts = {w: tok.encode(f"<|im_start|>user\n{w}<|im_end|>\n<|im_start|>tool\n")
               for w in words}
    keys = list(prompts)
    got = kept.generate(keys, [prompts[k] for k in keys], max_new_tokens=limit)
    want = generate_greedy(model, tok, [prompts[k] for k in keys], limit, batch_size=1)
    assert [tok.decode(g, skip_special_tokens=False) for g in got] == want
    fed = [len(kept.kept[k].ids) - len(prompts[k]) for k in keys]  # answer tokens after the first
    assert kept.row_tokens == sum(fed)
    assert len(set(fed)) > 1  # the answers differ in length: fixed batches would wait
    assert math.ceil(sum(fed) / batch) <= kept.forwards
    assert kept.forwards * batch - kept.row_tokens <= (batch - 1) * max(fed)
    for k in keys:
        _same_cache_as_one_forward(model, kept.kept[k])


def test_stream_answers_each_conversation_as_soon_as_it_asks(tiny):
    """`stream`: a conversation asks its next prompt (its previous prompt, its answer and more
    text) as soon as its answer ends, so answers of different rounds share forwards; every
    answer equals `generate_greedy`'s for the prompt asked, the answer tokens fed are reused,
    and each ended conversation's cache is dropped."""
    from envace.evaluation.model_probe import generate_greedy
    from envace.model.kept_prompts import KeptPrompts

    model, tok = tiny
    stop = tok.convert_tokens_to_ids(IM_END)
    batch, limit = 2, 8
    kept = KeptPrompts(model, tok.pad_token_id, stop, batch_size=batch)
    more = tok.encode("<|im_end|>\n<|im_start|>user\nand again<|im_end|>\n<|im_start|>tool\n")
    rounds = {"a": 3, "b": 1, "c": 2, "d": 2}  # prompts each conversation asks
    first = {k: tok.encode(f"<|im_start|>user\nsay {k} {k}<|im_end|>\n<|im_start|>tool\n")
             for k in rounds}
    asked: list[tuple[str, list[int], list[int]]] = []  # (key, prompt, answer) in answer order
    prompt_of = dict(first)

    def next_of(key, ids):
        asked.append((key, prompt_of[key], ids))
        if sum(k == key for k, _p, _a in asked) == rounds[key]:
            return None
        prompt_of[key] = prompt_of[key] + ids + more
        return prompt_of[key]

    kept.stream(list(first.items()), next_of, max_new_tokens=limit)
    assert sorted(k for k, _p, _a in asked) == sorted(k for k, n in rounds.items()
                                                       for _ in range(n))
    want = generate_greedy(model, tok, [p for _k, p, _a in asked], limit, batch_size=1)
    assert [tok.decode(a, skip_special_tokens=False) for _k, _p, a in asked] == want
    assert kept.kept == {}  # every conversation ended
    assert kept.reused > 0  # later prompts started from their conversation's kept cache
    # the same conversations asked in rounds (`generate`, as the probe asked before): the
    # same answers, in at least as many decode forwards (each round waits for its longest)
    by_rounds = KeptPrompts(model, tok.pad_token_id, stop, batch_size=batch)
    prompts, answers = dict(first), []
    for r in range(max(rounds.values())):
        keys = [k for k, n in rounds.items() if n > r]
        got = by_rounds.generate(keys, [prompts[k] for k in keys], limit)
        answers += list(zip(keys, got, strict=True))
        prompts = {k: prompts[k] + g + more for k, g in zip(keys, got, strict=True)}
    assert sorted((k, a) for k, _p, a in asked) == sorted(answers)
    assert kept.forwards <= by_rounds.forwards
    with pytest.raises(ValueError, match="distinct"):
        kept.stream([("a", first["a"]), ("a", first["a"])], next_of, 4)
