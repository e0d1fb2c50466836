"""A yardstick for bits per byte: a general-purpose compressor primed with the train split.

A world model's bits per byte on real responses (``audit.stats.likelihood``) means little alone:
BFCL responses are short JSON that repeats keys and values the tool has returned before. The
reference is what an off-the-shelf compressor needs for the same text when it has seen the same
tool's responses in the train split: raw deflate (``zlib``, level 9, no header or checksum) with
a *preset dictionary* (``zdict``) of that tool's distinct training responses, joined by newlines,
the most frequent last (nearest, so cheapest to refer to), cut to deflate's 32 KiB window. The
code length of a response is ``8 x`` the bytes of its compressed stream, i.e. its length *given*
the primed dictionary (the dictionary itself costs nothing: both sides have it). A tool the
train file never called gets no dictionary (plain deflate).

The stream ends with deflate's end-of-block code and at most 7 bits of padding, as the model's
code length ends with its end-of-message token: both say where the response ends.

    ref = CompressorReference.from_triples(reference_triples("train.jsonl"))
    ref.bits("ls", '{"current_directory_content": ["a.txt"]}')   # 40.0 once seen
"""

from __future__ import annotations

import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

WINDOW = 32 * 1024  # deflate's window: the part of a preset dictionary it can refer to
LEVEL = 9


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def dictionary(responses: Iterable[str]) -> bytes:
    """The preset dictionary of one tool's training responses: distinct ones, least frequent
    first (ties by first seen), newline-joined, the last ``WINDOW`` bytes."""
    counts = Counter(responses)
    first = {r: i for i, r in reversed(list(enumerate(counts)))}
    order = sorted(counts, key=lambda r: (counts[r], -first[r]))
    return _bytes("\n".join(order))[-WINDOW:]


def code_bits(text: str, zdict: bytes = b"") -> float:
    """Bits of ``text`` under raw deflate (level 9) primed with ``zdict``."""
    comp = (zlib.compressobj(LEVEL, zlib.DEFLATED, -15, zdict=zdict) if zdict
            else zlib.compressobj(LEVEL, zlib.DEFLATED, -15))
    return 8.0 * len(comp.compress(_bytes(text)) + comp.flush())


@dataclass
class CompressorReference:
    """Per tool, the preset dictionary of its train-split responses."""

    dictionaries: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def from_triples(cls, triples: Iterable[tuple[str, Any, str]]) -> CompressorReference:
        """From ``(tool, arguments, response)`` triples of the train split."""
        by_tool: dict[str, list[str]] = defaultdict(list)
        for tool, _args, response in triples:
            by_tool[str(tool)].append(str(response))
        return cls({t: dictionary(rs) for t, rs in by_tool.items()})

    def bits(self, tool: str, text: str) -> float:
        """The code length of ``text`` given the tool's dictionary, in bits."""
        return code_bits(text, self.dictionaries.get(str(tool), b""))
