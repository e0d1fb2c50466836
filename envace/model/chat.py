r"""The two-role chat format: ChatML rendering, role masks, and tool-call parsing.

One conversation (HF/OpenAI tool-calling messages, see docs/spec/trajectory.md) renders as ChatML:

    <|im_start|>system
    You are a helpful assistant.

    Tools:
    get_weather(city: str, unit?: str) - Current weather in a city.
    To call a tool, write <tool_call>{"name": ...}</tool_call>; ...<|im_end|>
    <|im_start|>user
    Weather in Paris?<|im_end|>
    <|im_start|>assistant
    Let me check.
    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><|im_end|>
    <|im_start|>tool
    {"temp": 18}<|im_end|>

Every token has a role: ACT (what the assistant writes: its text, its <tool_call> blocks and the
closing <|im_end|>, so the model learns to stop), REHEARSE (the content of a tool message the
policy wrote, `rehearsed: true`, plus its <|im_end|>), or CONTEXT (everything else: system, user,
real tool output, the `<|im_start|>role\n` headers, the newlines between turns).

`encode_with_roles` tokenizes segment by segment (markers as their ids, text with special-token
strings kept as plain text), which is the token stream a rollout produces: a prompt ending at a
header's newline, then freshly generated text. With the tiny tokenizer (newline is always its own
pre-token) this equals tokenizing `render(...)`; with other byte-level tokenizers it does whenever
no assistant text or rehearsed response starts with whitespace (else the header's `\n` may merge).
Model output is data: `parse_assistant` only JSON-decodes it and never raises.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
STOP = IM_END
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
DEFAULT_SYSTEM = "You are a helpful assistant."
CALL_HINT = (
    'To call a tool, write <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>; '
    "each result comes back as a tool turn."
)
# JSON-schema (and BFCL) type names -> the short names the tool listing shows
_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}
_TYPES |= {"array": "list", "tuple": "list", "object": "dict", "dict": "dict", "null": "None"}
# Marker strings are escaped inside call JSON ("<" as \u003c, still the same JSON value),
# so argument strings can hold anything and the blocks still parse back.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_JSON_ESCAPES = {m: "\\u003c" + m[1:] for m in (CALL_OPEN, CALL_CLOSE, IM_START, IM_END)}

Message = Mapping[str, Any]


class Role(IntEnum):
    """What a token is trained as: never (CONTEXT), as the actor (ACT), as the world (REHEARSE)."""

    CONTEXT = 0
    ACT = 1
    REHEARSE = 2


# ---------------------------------------------------------------- tool listing


def _short_type(schema: Any) -> str:
    if not isinstance(schema, Mapping):
        return "any"
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return "|".join(_TYPES.get(str(k), str(k)) for k in kind)
    enum = schema.get("enum")
    if isinstance(enum, list) and 0 < len(enum) <= 6:
        return "|".join(json.dumps(v, ensure_ascii=False) for v in enum)
    name = _TYPES.get(str(kind), str(kind))
    if name == "list" and isinstance(schema.get("items"), Mapping):
        return f"list[{_short_type(schema['items'])}]"
    return name


def _truncate(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    if limit < 4:
        return ""
    cut = text[: limit - 3]
    if " " in cut:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,.;:") + "..."


def tool_line(tool: Mapping[str, Any], desc_chars: int = 80) -> str:
    """One tool as `name(a: int, b?: str) - description`, `?` marking optional parameters.

    Accepts `{"type": "function", "function": {...}}` or a bare `{"name", "parameters", ...}`.
    """
    fn = tool["function"] if isinstance(tool.get("function"), Mapping) else tool
    params = fn.get("parameters")
    params = params if isinstance(params, Mapping) else {}
    props = params.get("properties")
    props = props if isinstance(props, Mapping) else {}
    required = set(params.get("required") or [])
    args = ", ".join(
        f"{p}{'' if p in required else '?'}: {_short_type(s)}" for p, s in props.items()
    )
    desc = str(fn.get("description") or "")
    desc = _truncate(desc.rsplit("Tool description:", 1)[-1], desc_chars)  # BFCL's preamble
    return f"{fn.get('name', '?')}({args})" + (f" - {desc}" if desc else "")


def tool_listing(
    tools: Sequence[Mapping[str, Any]], desc_chars: int = 80, max_chars: int | None = None
) -> str:
    """The tools, one line each, descriptions cut to `desc_chars`.

    Longer than `max_chars`: descriptions are dropped, then the last tools, with a note saying
    how many were left out.
    """
    lines = [tool_line(t, desc_chars) for t in tools]
    if max_chars is None or len("\n".join(lines)) <= max_chars:
        return "\n".join(lines)
    lines = [tool_line(t, 0) for t in tools]
    kept: list[str] = []
    for i, line in enumerate(lines):
        left = len(lines) - i - 1
        note = [f"(+{left} more tools not listed)"] if left else []
        if len("\n".join([*kept, line, *note])) > max_chars:
            kept.append(f"(+{left + 1} more tools not listed)")
            break
        kept.append(line)
    return "\n".join(kept)


def system_text(
    tools: Sequence[Mapping[str, Any]] | None = None,
    system: str | None = None,
    desc_chars: int = 80,
    max_chars: int | None = None,
) -> str:
    """The system turn's text: the system prompt, then (with tools) the listing and call hint."""
    text = DEFAULT_SYSTEM if system is None else system
    if tools:
        listing = tool_listing(tools, desc_chars, max_chars)
        text = f"{text}\n\nTools:\n{listing}\n{CALL_HINT}" if text else f"Tools:\n{listing}"
    return text


# ---------------------------------------------------------------- rendering


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return str(content)


def format_call(name: str, arguments: Any) -> str:
    """One `<tool_call>{"name": ..., "arguments": ...}</tool_call>` block, deterministic JSON.

    Arguments keep their key order; a JSON-string argument that decodes to an object is written
    as that object, any other string is written as a string (the call stays malformed).
    """
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except ValueError:
            decoded = None
        arguments = decoded if isinstance(decoded, dict) else arguments
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    try:
        body.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates (decoded from "\ud800" escapes): keep escaped
        body = json.dumps({"name": name, "arguments": arguments})
    for marker, escaped in _JSON_ESCAPES.items():
        body = body.replace(marker, escaped)
    return f"{CALL_OPEN}{body}{CALL_CLOSE}"


def assistant_text(message: Message) -> str:
    """What the assistant generated for `message` (without the stop marker).

    The content, then one `<tool_call>` block per call, separated by newlines.
    """
    content = _text(message.get("content"))
    blocks = []
    for call in message.get("tool_calls") or []:
        fn = call["function"] if isinstance(call.get("function"), Mapping) else call
        blocks.append(format_call(str(fn.get("name", "")), fn.get("arguments", {})))
    return "\n".join([content, *blocks] if content else blocks)


def render_pieces(
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None = None,
    system: str | None = None,
    generation_prompt: str | None = None,
    desc_chars: int = 80,
    max_chars: int | None = None,
) -> list[tuple[str, Role, bool]]:
    """The rendering as `(text, role, is_marker)` pieces; markers are `<|im_start|>`/`<|im_end|>`.

    A leading system message gives the system prompt (the `system` argument overrides it); there
    is always one system turn first. `generation_prompt` ("assistant" or "tool") appends the open
    header a generation continues from.
    """
    msgs = list(messages)
    if msgs and msgs[0].get("role") == "system":
        system = _text(msgs.pop(0).get("content")) if system is None else system
    pieces: list[tuple[str, Role, bool]] = []

    def turn(role: str, text: str, body_role: Role) -> None:
        pieces.extend([(IM_START, Role.CONTEXT, True), (f"{role}\n", Role.CONTEXT, False)])
        if text:
            pieces.append((text, body_role, False))
        pieces.extend([(IM_END, body_role, True), ("\n", Role.CONTEXT, False)])

    turn("system", system_text(tools, system, desc_chars, max_chars), Role.CONTEXT)
    for m in msgs:
        role = str(m.get("role", "user"))
        if role == "assistant":
            turn(role, assistant_text(m), Role.ACT)
        elif role == "tool":
            body_role = Role.REHEARSE if m.get("rehearsed") else Role.CONTEXT
            turn(role, _text(m.get("content")), body_role)
        else:
            turn(role, _text(m.get("content")), Role.CONTEXT)
    if generation_prompt:
        pieces += [(IM_START, Role.CONTEXT, True), (f"{generation_prompt}\n", Role.CONTEXT, False)]
    return pieces


def render_segments(
    messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None, **kw: Any
) -> list[tuple[str, Role]]:
    """The rendering as `(text, role)` segments, adjacent pieces of one role merged."""
    segments: list[tuple[str, Role]] = []
    for text, role, _ in render_pieces(messages, tools, **kw):
        if segments and segments[-1][1] == role:
            segments[-1] = (segments[-1][0] + text, role)
        else:
            segments.append((text, role))
    return segments


def render(
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None = None,
    system: str | None = None,
    **kw: Any,
) -> str:
    """The whole conversation as one ChatML string."""
    return "".join(t for t, _, _ in render_pieces(messages, tools, system, **kw))


def assistant_prefix() -> str:
    """The header an acting generation continues from."""
    return f"{IM_START}assistant\n"


def tool_prefix() -> str:
    """The header a rehearsing generation continues from."""
    return f"{IM_START}tool\n"


def stop_string() -> str:
    """Where every generated message ends."""
    return STOP


# ---------------------------------------------------------------- tokenizing


def encode_text(tokenizer: Any, text: str, measuring: bool = False) -> list[int]:
    """Ids of plain `text`: special-token strings in it stay text (data cannot open a turn).

    ``measuring``: the ids only measure a text that may be rejected for its length (a prompt
    that does not fit the context is never run through the model, so the tokenizer's warning
    that running it "will result in indexing errors" would be false)."""
    if not text:
        return []
    text = _LONE_SURROGATE.sub("\ufffd", text)  # data cannot crash the tokenizer (issue 39)
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True,
                          verbose=not measuring)["input_ids"])


def marker_id(tokenizer: Any, marker: str) -> int:
    """The single id of a ChatML marker; ValueError when the tokenizer lacks it."""
    token_id = tokenizer.convert_tokens_to_ids(marker)
    if token_id is None or tokenizer.convert_ids_to_tokens(token_id) != marker:
        raise ValueError(f"tokenizer has no single token for {marker!r}")
    return int(token_id)


def encode_with_roles(
    tokenizer: Any,
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None = None,
    measuring: bool = False,
    **kw: Any,
) -> tuple[list[int], list[int]]:
    """`(input_ids, roles)`, one `Role` value per id, tokenizing the pieces one by one
    (``measuring``: see :func:`encode_text`)."""
    markers = {m: marker_id(tokenizer, m) for m in (IM_START, IM_END)}
    merged: list[tuple[str, Role, bool]] = []  # join text pieces of one role: fewer boundaries
    for piece in render_pieces(messages, tools, **kw):
        if merged and not piece[2] and not merged[-1][2] and merged[-1][1] == piece[1]:
            merged[-1] = (merged[-1][0] + piece[0], piece[1], False)
        else:
            merged.append(piece)
    ids: list[int] = []
    roles: list[int] = []
    for text, role, is_marker in merged:
        piece_ids = [markers[text]] if is_marker else encode_text(tokenizer, text, measuring)
        ids.extend(piece_ids)
        roles.extend([int(role)] * len(piece_ids))
    return ids, roles


# ---------------------------------------------------------------- parsing


@dataclass(frozen=True)
class ParsedCall:
    """A well-formed tool call; `index` is its position among all blocks of the turn."""

    name: str
    arguments: dict[str, Any]
    raw: str
    index: int


@dataclass(frozen=True)
class MalformedCall:
    """A `<tool_call>` block that is not a usable call, kept with its text and the reason."""

    raw: str
    reason: str
    index: int
    name: str | None = None


@dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn: its text outside the blocks, its calls, its malformed blocks."""

    content: str
    calls: list[ParsedCall] = field(default_factory=list)
    malformed: list[MalformedCall] = field(default_factory=list)


def _parse_block(body: str, raw: str, index: int) -> ParsedCall | MalformedCall:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as err:
        return MalformedCall(raw, f"invalid JSON: {str(err)[:120]}", index)
    if not isinstance(obj, dict):
        return MalformedCall(raw, "call is not a JSON object", index)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return MalformedCall(raw, "missing tool name", index)
    key = "arguments" if "arguments" in obj else "parameters"
    args = obj.get(key, {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return MalformedCall(raw, "arguments string is not valid JSON", index, name)
    if not isinstance(args, dict):
        return MalformedCall(raw, "arguments is not a JSON object", index, name)
    return ParsedCall(name, args, raw, index)


def parse_assistant(text: str) -> ParsedTurn:
    """Split generated assistant text into content, calls and malformed blocks; never raises.

    Text after the first `<|im_end|>` is ignored. A block missing `</tool_call>` (before the end or
    the next `<tool_call>`) is malformed, as are invalid JSON, a missing name and non-object
    arguments; missing arguments mean `{}`, a JSON-string argument is decoded, and `parameters`
    is read when `arguments` is absent. Content: the text before the first block less the one
    newline that separates it, plus any non-blank text between or after blocks.
    """
    text = text if isinstance(text, str) else str(text)
    text = text.split(STOP, 1)[0]
    pieces: list[str] = []
    items: list[ParsedCall | MalformedCall] = []
    pos = 0
    while (start := text.find(CALL_OPEN, pos)) >= 0:
        pieces.append(text[pos:start])
        body_at = start + len(CALL_OPEN)
        close, reopen = text.find(CALL_CLOSE, body_at), text.find(CALL_OPEN, body_at)
        if close < 0 or 0 <= reopen < close:
            pos = reopen if reopen >= 0 else len(text)
            items.append(MalformedCall(text[start:pos], "unclosed <tool_call>", len(items)))
            continue
        pos = close + len(CALL_CLOSE)
        items.append(_parse_block(text[body_at:close], text[start:pos], len(items)))
    pieces.append(text[pos:])
    if not items:
        return ParsedTurn(content=pieces[0])
    head = pieces[0][:-1] if pieces[0].endswith("\n") else pieces[0]
    content = head + "".join(p for p in pieces[1:] if p.strip())
    return ParsedTurn(
        content=content,
        calls=[c for c in items if isinstance(c, ParsedCall)],
        malformed=[c for c in items if isinstance(c, MalformedCall)],
    )


def tool_calls_of(turn: ParsedTurn, id_prefix: str = "call") -> list[dict[str, Any]]:
    """The turn's well-formed calls as HF/OpenAI `tool_calls` entries, ids `{prefix}_{index}`."""
    return [
        {
            "id": f"{id_prefix}_{c.index}",
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for c in turn.calls
    ]
