"""An MCP ``tools/call`` result as the response text an agent sees, and tools as schemas.

The text is the result's text content blocks joined with newlines, in the order the SDK gives
them. Nothing is dropped silently: an image or audio block is described by its MIME type, size
and SHA-256 (``[image image/png, 68 bytes, sha256 1f2e...]``), a resource link by its URI, an
embedded resource by its URI and its text (or a description of its blob); a result with no
content but structured content gives that as JSON. Then the working directory's path, which
differs between trajectories, is written as ``{workdir}``, and the profile's volatile patterns
are replaced by ``<volatile>``.

    result_text(call_result, workdir="/tmp/envace-mcp-x/work", volatile=(r"\\d{4}-\\d\\d-\\d\\d",))
    function_schema(tool)     # {"type": "function", "function": {"name", "description", ...}}
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from typing import Any

import mcp_types as types

WORKDIR_TOKEN = "{workdir}"
VOLATILE_TOKEN = "<volatile>"


def _blob(kind: str, mime: str | None, data: str) -> str:
    try:
        raw = base64.b64decode(data, validate=True)
        size, digest = f"{len(raw)} bytes", hashlib.sha256(raw).hexdigest()[:16]
    except (binascii.Error, ValueError):
        size, digest = f"{len(data)} characters, not base64", hashlib.sha256(
            data.encode("utf-8", "replace")).hexdigest()[:16]
    return f"[{kind} {mime or 'unknown type'}, {size}, sha256 {digest}]"


def block_text(block: Any) -> str:
    """One content block as text (see the module docstring)."""
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent):
        return _blob("image", block.mime_type, block.data)
    if isinstance(block, types.AudioContent):
        return _blob("audio", block.mime_type, block.data)
    if isinstance(block, types.ResourceLink):
        return f"[resource link {block.uri} ({block.name})]"
    if isinstance(block, types.EmbeddedResource):
        res = block.resource
        head = f"[resource {res.uri}{' ' + res.mime_type if res.mime_type else ''}]"
        if isinstance(res, types.TextResourceContents):
            return f"{head}\n{res.text}"
        return f"{head} " + _blob("blob", res.mime_type, res.blob)
    kind = getattr(block, "type", type(block).__name__)
    return f"[{kind} content]"


def result_text(result: types.CallToolResult, workdir: str | None = None,
                volatile: tuple[str, ...] = ()) -> str:
    """The response text of a ``tools/call`` result (see the module docstring)."""
    parts = [block_text(b) for b in result.content]
    if not parts and result.structured_content is not None:
        parts = [json.dumps(result.structured_content, ensure_ascii=False, sort_keys=True)]
    text = "\n".join(parts)
    return canonical_text(text, workdir, volatile)


def canonical_text(text: str, workdir: str | None, volatile: tuple[str, ...] = ()) -> str:
    """``text`` with the workdir's path written as ``{workdir}`` and volatile parts replaced."""
    if workdir:
        for path in sorted({workdir, _real(workdir)}, key=len, reverse=True):
            # the whole path only: not where it is the start of a longer name (/w in /wav)
            text = re.sub(re.escape(path) + r"(?![\w.-])", lambda _: WORKDIR_TOKEN, text)
    for pattern in volatile:
        text = re.sub(pattern, VOLATILE_TOKEN, text)
    return text


def _real(path: str) -> str:
    return os.path.realpath(path)


def fill_workdir(value: Any, workdir: str) -> Any:
    """Arguments with ``{workdir}`` in any string replaced by the real path (strings only:
    arguments are data, never evaluated)."""
    if isinstance(value, str):
        return value.replace(WORKDIR_TOKEN, workdir)
    if isinstance(value, list):
        return [fill_workdir(v, workdir) for v in value]
    if isinstance(value, dict):
        return {k: fill_workdir(v, workdir) for k, v in value.items()}
    return value


def function_schema(tool: types.Tool) -> dict[str, Any]:
    """An MCP tool in the OpenAI/HF function format (its input schema as the parameters)."""
    params = dict(tool.input_schema) if isinstance(tool.input_schema, dict) else {}
    params.setdefault("type", "object")
    params.setdefault("properties", {})
    return {"type": "function", "function": {
        "name": tool.name, "description": tool.description or tool.title or tool.name,
        "parameters": params}}
