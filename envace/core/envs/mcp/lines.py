"""The server's stdout, read as bounded lines: a bad answer is its own clear error, at once.

The SDK's stdio transport (``mcp.client.stdio``) reads a server's stdout through anyio's
``TextReceiveStream`` and joins chunks with ``(buffer + chunk).split("\\n")``: a 30 MB answer line
costs quadratic time (minutes on a loaded machine), and a line pydantic will not parse (a valid
JSON string holding a lone surrogate, ``"\\ud800"``) is logged and dropped. Either way the
request never gets its answer and the call ran into its timeout, reported as a hung server.

:class:`BoundedLines` takes the place of ``TextReceiveStream`` there (:func:`install`): it yields
whole lines in linear time, and replaces an answer line that

- is longer than :data:`MAX_ANSWER_LINE_BYTES` (read through without keeping it),
- is not valid text in the server's encoding, or
- holds a lone surrogate (valid JSON, but no Unicode text: no envace writer could keep it),

by a JSON-RPC error answer to the same request id, code :data:`REFUSED_ANSWER`, saying which
(``envace.core.envs.mcp.client`` reports it as that call's error; the server goes on). Every other
line passes unchanged, stray non-JSON-RPC lines included (the SDK skips those as before).
"""

from __future__ import annotations

import json
import re
from typing import Any

import anyio

from envace.core.schema import MAX_CALL_BYTES

#: The longest answer line read from a server: four times a response's limit (JSON escapes and
#: non-text blocks take room; the response text itself is held to MAX_CALL_BYTES downstream).
MAX_ANSWER_LINE_BYTES = 4 * MAX_CALL_BYTES
#: The JSON-RPC error code of an answer envace refused (implementation-defined server range).
REFUSED_ANSWER = -32099
_KEEP = 512  # bytes kept of each end of an over-long line (where its "id" is)
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_ID = rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.){0,200}")'
_ID_HEAD = re.compile(rb'^\s*\{(?:\s*"jsonrpc"\s*:\s*"2\.0"\s*,)?\s*' + _ID)
_ID_TAIL = re.compile(rb',\s*' + _ID + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*$')


def _refusal(rid: bytes, why: str) -> bytes:
    msg = json.dumps({"jsonrpc": "2.0", "id": 0, "error": {"code": REFUSED_ANSWER,
                                                            "message": why}})
    return msg.replace('"id": 0', '"id": ' + rid.decode("ascii", "replace"), 1).encode()


def _id_of(head: bytes, tail: bytes) -> bytes | None:
    m = _ID_HEAD.search(head) or _ID_TAIL.search(tail)
    return m.group(1) if m else None


def checked_line(line: bytes, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """``line`` (without its newline) as the transport may parse it: itself, or a refusal."""
    try:
        text = line.decode(encoding, errors)
    except UnicodeDecodeError as exc:
        rid = _id_of(line[:_KEEP], line[-_KEEP:])
        return line if rid is None else _refusal(
            rid, f"the answer is not valid {encoding} text ({exc.reason} at byte {exc.start})")
    if not _SURROGATE.search(line):
        return line
    try:
        data = json.loads(text)
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        rid = (json.dumps(data["id"]).encode() if isinstance(data, dict)
               and isinstance(data.get("id"), int | str) else None)
        if rid is not None:
            return _refusal(rid, "the answer holds a lone surrogate (a \\ud800-\\udfff escape "
                                 "without its pair): it is no Unicode text")
    except (ValueError, RecursionError):
        pass  # not JSON: the SDK skips it as it skips any stray line
    return line


class BoundedLines:
    """What the SDK's stdio transport reads stdout through (see the module docstring); an
    async iterator of decoded chunks, each ending on a line break."""

    def __init__(self, transport_stream: Any, encoding: str = "utf-8",
                 errors: str = "strict") -> None:
        self._stream, self._encoding, self._errors = transport_stream, encoding, errors
        self._buf = bytearray()
        self._skip: tuple[bytes, bytearray, int] | None = None  # head, tail, bytes seen
        self._eof = False

    def __aiter__(self) -> BoundedLines:
        return self

    async def __anext__(self) -> str:
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                lines = bytes(self._buf[:nl])
                del self._buf[:nl + 1]
                return self._emit(lines)
            if self._eof:
                if self._buf:  # a last line without its break
                    rest, self._buf = bytes(self._buf), bytearray()
                    return self._emit(rest)
                raise StopAsyncIteration
            if len(self._buf) > MAX_ANSWER_LINE_BYTES and self._skip is None:
                self._skip = (bytes(self._buf[:_KEEP]), bytearray(self._buf[-_KEEP:]),
                              len(self._buf))
                self._buf = bytearray()
            try:
                chunk = await self._stream.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                self._eof = True
                chunk = b""
            if self._skip is not None:  # an over-long line: read through, kept at its ends
                head, tail, seen = self._skip
                nl = chunk.find(b"\n")
                part = chunk if nl < 0 else chunk[:nl]
                tail = (tail + part)[-_KEEP:]
                self._skip = (head, tail, seen + len(part))
                if nl < 0 and not self._eof:
                    continue
                self._skip = None
                self._buf += chunk[nl + 1:] if nl >= 0 else b""
                rid = _id_of(head, bytes(tail))
                if rid is not None:
                    return _refusal(rid, f"the answer of {seen + len(part)} bytes passes the "
                                         f"{MAX_ANSWER_LINE_BYTES}-byte limit of an answer "
                                         "(docs/audit.md, size limits)").decode() + "\n"
                continue  # no id to answer: dropped, as the SDK drops a line it cannot parse
            self._buf += chunk

    def _emit(self, line: bytes) -> str:
        out = checked_line(line, self._encoding, self._errors)
        return out.decode(self._encoding, "replace") + "\n"

    async def aclose(self) -> None:
        await self._stream.aclose()


def install() -> bool:
    """Make the SDK's stdio transport read through :class:`BoundedLines` (once; True when it
    is in place). A later SDK that reads differently leaves its own reader (False)."""
    import mcp.client.stdio as stdio

    if getattr(stdio, "TextReceiveStream", None) is BoundedLines:
        return True
    if not hasattr(stdio, "TextReceiveStream") or not hasattr(stdio, "_parse_line"):
        return False
    stdio.TextReceiveStream = BoundedLines  # type: ignore[attr-defined]
    return True
