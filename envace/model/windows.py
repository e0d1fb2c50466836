"""How a conversation is cut to a context budget: training windows and generation prompts.

A conversation is encoded once and cut into turns (``message_blocks``); SFT trains on windows
of whole turns (``make_windows``) and every generation prompt (the probe, the vLLM lane) is cut
the same way (``prompt_ids``): the system turn, the last user message when it falls outside, as
many of the latest messages as fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from envace.model.chat import IM_START, Role, encode_with_roles, marker_id

#: Tool descriptions in a prompt's tool listing are cut to this many characters by default.
DESC_CHARS = 60
#: the fewest prompt tokens a generating probe keeps, whatever the answer's room
MIN_PROMPT = 64


def prompt_budget(context: int, max_new_tokens: int) -> int:
    """The tokens a generation prompt may take: the context less the answer's room, at least
    :data:`MIN_PROMPT`."""
    return max(MIN_PROMPT, context - max_new_tokens)


def message_blocks(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    generation_prompt: str | None = None,
    measuring: bool = False,
) -> tuple[list[tuple[list[int], list[int]]], list[str]]:
    """`(blocks, kinds)`: the encoding cut into turns, each `(ids, roles)`, and each turn's role.

    Block 0 is the system turn (a leading system message is folded into it); then one block per
    message; with `generation_prompt`, a last block holding the open header. Turns are cut at
    `<|im_start|>`, which text can never produce (`encode_text` keeps marker strings as text).
    ``measuring``: the whole encoding is only measured and cut, never run as one sequence
    (`encode_text`: no false "indexing errors" warning).
    """
    ids, roles = encode_with_roles(tokenizer, messages, tools, measuring=measuring,
                                   generation_prompt=generation_prompt)
    start = marker_id(tokenizer, IM_START)
    cuts = [i for i, t in enumerate(ids) if t == start] + [len(ids)]
    blocks = [(ids[a:b], roles[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]
    msgs = list(messages)
    if msgs and msgs[0].get("role") == "system":
        msgs = msgs[1:]
    kinds = ["system"] + [str(m.get("role", "user")) for m in msgs]
    if generation_prompt:
        kinds.append(f"prompt:{generation_prompt}")
    if len(kinds) != len(blocks):
        raise RuntimeError(f"{len(blocks)} turns encoded for {len(kinds)} messages")
    return blocks, kinds


def _carry(blocks: list, kinds: list[str], start: int) -> list[int]:
    """Ids of the last user message before `start` (context for a window starting there)."""
    for i in range(start - 1, 0, -1):
        if kinds[i] == "user":
            return list(blocks[i][0])
    return []


def make_windows(
    blocks: list[tuple[list[int], list[int]]], kinds: list[str], seq_len: int
) -> list[tuple[list[int], list[int]]]:
    """Cut one encoded trajectory into training windows of at most `seq_len` tokens.

    Each window: the system turn, then (when it starts after the first message) the last user
    message before it, both as context, then consecutive whole messages while they fit. A message
    that does not fit an otherwise empty window is cut at its end. Windows without a trained
    token are dropped.
    """
    sys_ids = list(blocks[0][0])[: seq_len // 2]
    out: list[tuple[list[int], list[int]]] = []
    i, n = 1, len(blocks)
    while i < n:
        carry = _carry(blocks, kinds, i) if i > 1 else []
        if len(sys_ids) + len(carry) + len(blocks[i][0]) > seq_len:
            carry = []
        ids = sys_ids + carry
        roles = [int(Role.CONTEXT)] * len(ids)
        j = i
        while j < n and len(ids) + len(blocks[j][0]) <= seq_len:
            ids += blocks[j][0]
            roles += blocks[j][1]
            j += 1
        if j == i:  # one message longer than the room left: keep its start
            room = seq_len - len(ids)
            ids += blocks[i][0][:room]
            roles += blocks[i][1][:room]
            j = i + 1
        if any(r != Role.CONTEXT for r in roles):
            out.append((ids, roles))
        i = j
    return out


def prompt_ids(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    generation_prompt: str,
    max_len: int,
) -> list[int]:
    """A generation prompt of at most `max_len` ids, cut as training windows are.

    The system turn, the last user message when it would fall outside, as many of the latest
    messages as fit, and the open `<|im_start|>{generation_prompt}\\n` header.
    """
    blocks, kinds = message_blocks(tokenizer, messages, tools, generation_prompt)
    header, body = blocks[-1][0], blocks[:-1]
    sys_ids = list(body[0][0])[: max(0, max_len - len(header)) // 2]
    room = max_len - len(header) - len(sys_ids)
    start, used = len(body), 0
    while start > 1 and used + len(body[start - 1][0]) <= room:
        start -= 1
        used += len(body[start][0])
    carry = _carry(body, kinds, start) if start > 1 else []
    if used + len(carry) > room:
        carry = []
    tail = [t for b in body[start:] for t in b[0]]
    return sys_ids + carry + tail + list(header)


def fitting_tasks(tasks: Sequence[Any], tokenizer: Any, max_context_tokens: int,
                  max_new_tokens: int, desc_chars: int = DESC_CHARS) -> list[Any]:
    """Tasks whose prompt leaves room for at least two messages of ``max_new_tokens`` within
    ``max_context_tokens``; ValueError when none does."""
    room = max_context_tokens - 2 * max_new_tokens
    out = []
    for t in tasks:
        msgs = t.opening_messages()
        if sum(len(str(m.get("content", ""))) for m in msgs) > 8 * room:
            continue  # far too long: no need to tokenize
        # measured only: a prompt past the room is dropped here and never reaches the model
        ids, _ = encode_with_roles(tokenizer, msgs, t.tools(turn=0), measuring=True,
                                   generation_prompt="assistant", desc_chars=desc_chars)
        if len(ids) <= room:
            out.append(t)
    if not out:
        raise ValueError(f"no task fits max_context_tokens={max_context_tokens}: raise it")
    return out
