"""A ledger MCP server written without any SDK: plain JSON-RPC 2.0 over stdio, one message a
line (the tests of envace's MCP bridge start it).

State lives in one JSON file, ``$LEDGER_DB`` (the profile puts it in the workdir). Tools:
``add_entry``, ``balance``, ``list_entries``, ``remove_entry``; and, for the robustness tests,
``crash`` (the process exits mid-call), ``hang`` (never answers), ``garbage`` (writes a line that
is not JSON-RPC, then answers), ``picture`` (an image content block), ``fail`` (``isError``),
``reject`` (a JSON-RPC error answer).
"""

import json
import os
import sys
import time

DB = os.environ.get("LEDGER_DB", "ledger.json")
OBJ = {"type": "object"}
TOOLS = [
    {"name": "add_entry", "description": "Add an entry of `amount` cents to `account`.",
     "inputSchema": {"type": "object", "properties": {
         "account": {"type": "string"}, "amount": {"type": "integer"},
         "memo": {"type": "string"}}, "required": ["account", "amount"]}},
    {"name": "balance", "description": "The balance of `account` in cents.",
     "annotations": {"readOnlyHint": True},
     "inputSchema": {"type": "object", "properties": {"account": {"type": "string"}},
                     "required": ["account"]}},
    {"name": "list_entries", "description": "Every entry, oldest first.",
     "inputSchema": {"type": "object", "properties": {}}},
    {"name": "remove_entry", "description": "Remove the entry numbered `number` (from 1).",
     "inputSchema": {"type": "object", "properties": {"number": {"type": "integer"}},
                     "required": ["number"]}},
    {"name": "crash", "description": "Exit the process mid-call.", "inputSchema": OBJ},
    {"name": "hang", "description": "Never answer.", "inputSchema": OBJ},
    {"name": "garbage", "description": "Write a non-JSON line, then answer.", "inputSchema": OBJ},
    {"name": "picture", "description": "A 1-pixel PNG.", "inputSchema": OBJ},
    {"name": "fail", "description": "Always an error result.", "inputSchema": OBJ},
    {"name": "reject", "description": "A JSON-RPC error answer.", "inputSchema": OBJ},
]
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5"
       "ErkJggg==")


def load():
    try:
        with open(DB) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"entries": []}


def save(db):
    with open(DB, "w") as f:
        json.dump(db, f, indent=1, sort_keys=True)


def text(t, error=False):
    return {"content": [{"type": "text", "text": t}], "isError": error}


def call(name, args):
    db = load()
    if name == "add_entry":
        db["entries"].append({"account": args["account"], "amount": args["amount"],
                              "memo": args.get("memo", "")})
        save(db)
        return text(f"entry {len(db['entries'])} added")
    if name == "balance":
        total = sum(e["amount"] for e in db["entries"] if e["account"] == args["account"])
        return text(json.dumps({"account": args["account"], "balance": total}))
    if name == "list_entries":
        return text(json.dumps(db["entries"]))
    if name == "remove_entry":
        n = args["number"]
        if not 1 <= n <= len(db["entries"]):
            return text(f"no entry {n}", error=True)
        db["entries"].pop(n - 1)
        save(db)
        return text(f"entry {n} removed")
    if name == "crash":
        os._exit(3)
    if name == "hang":
        time.sleep(3600)
    if name == "garbage":
        sys.stdout.write("this is not json-rpc\n")
        sys.stdout.flush()
        return text("answered after garbage")
    if name == "picture":
        return {"content": [{"type": "text", "text": "a picture:"},
                            {"type": "image", "data": PNG, "mimeType": "image/png"}]}
    if name == "fail":
        return text("this tool always fails", error=True)
    if name == "reject":
        raise ValueError("rejected by the ledger")
    return None


def answer(msg):
    method, mid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
    if method == "initialize":
        return {"protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "ledger-no-sdk", "version": "1.0"}}
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        result = call(params.get("name"), params.get("arguments") or {})
        if result is None:
            raise LookupError(f"unknown tool {params.get('name')}")
        return result
    if method == "ping":
        return {}
    if mid is not None:
        raise NotImplementedError(method)
    return None


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if "id" not in msg or "method" not in msg:
            continue  # a notification or a response: nothing to answer
        try:
            out = {"jsonrpc": "2.0", "id": msg["id"], "result": answer(msg)}
        except Exception as exc:
            out = {"jsonrpc": "2.0", "id": msg["id"],
                   "error": {"code": -32601 if isinstance(exc, NotImplementedError) else -32602,
                             "message": str(exc)}}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
