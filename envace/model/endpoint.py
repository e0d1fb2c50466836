"""An OpenAI-compatible server as a world model: prompts out, tool responses back, robustly.

    client = EndpointClient("http://127.0.0.1:8000/v1", "smollm2")
    client.check()                                  # EndpointError: down, or not serving "smollm2"
    answers = client.answer_all([request_for(messages, tools)], concurrency=4)
    answers[0].text or answers[0].error             # the response, or why there is none

Two ways to ask (`api`):

- ``completions`` (the default): ``POST /v1/completions`` with the conversation rendered as the
  project's own ChatML (`envace.model.chat.render`, the tool listing in the system turn) and an open
  ``<|im_start|>tool`` header, greedy, stopping at ``<|im_end|>``. This is the prompt a model
  trained by envace rehearses from, and the text the in-process probe tokenizes: a server
  tokenizing it gets the same ids (checked on SmolLM2 in the vLLM lane) unless a message's text
  contains a marker string or starts with whitespace.
- ``chat``: ``POST /v1/chat/completions`` with a system instruction to answer as the tool and
  the rendered conversation as the user turn: for general chat models served without raw
  completions. Its prompt is the server's chat template, not envace's format.

Failures are data, never a crash: a timeout, a refused connection, a 5xx/408/429, an answer that
is not JSON or lacks ``choices[0].text`` (``message.content`` for chat) is retried with
exponential backoff (`backoff_s` * 2^k, at most `max_backoff_s`, `retries` times); any other 4xx
is not retried. `timeout_s` bounds a whole attempt (connect, headers, body: a server that sends
one byte a second is cut off at it), and Ctrl-C ends the requests in flight at once
(`abort`). What still fails comes back as `Answer(text=None, error=reason)`. Nothing but the
configured URL is contacted (a redirect is an error, never followed: the key goes nowhere
else); the server's text is only ever used as a string. A server that
wants a key gets `Authorization: Bearer $ENVACE_ENDPOINT_API_KEY` when that variable is set
(never any other variable: a key is sent only where the user said so).
Stdlib only (urllib and a thread pool): no torch, no HTTP dependency.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from envace.model import chat

APIS = ("completions", "chat")
CHAT_SYSTEM = ("You simulate a tool backend. Given the conversation and the latest tool call, "
               "reply with only the tool's response (JSON), nothing else.")
RETRY_STATUS = {408, 429}  # besides 5xx: request timeout, rate limited
MAX_REASON = 300
#: The longest answer body read from a served model (16 MiB: an answer is a few hundred tokens);
#: a longer one is refused unread past it, never held in memory whole (docs/audit.md, size limits)
MAX_ANSWER_BYTES = 16 * 1024 * 1024
API_KEY_ENV = "ENVACE_ENDPOINT_API_KEY"


class EndpointError(RuntimeError):
    """The endpoint cannot be used at all (down, not OpenAI-compatible, model not served)."""


@dataclass(frozen=True)
class Answer:
    """One request's outcome: `text`, or `error` (the last failure's reason); `attempts` made."""

    text: str | None
    error: str | None = None
    attempts: int = 1


class _Failure(Exception):
    def __init__(self, reason: str, retry: bool) -> None:
        super().__init__(reason)
        self.reason, self.retry = reason, retry


def normalize_base(url: str) -> str:
    """The API base: `http(s)://host[:port]/prefix`; a bare host gets `/v1`. ValueError if bad."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {url!r} (e.g. http://127.0.0.1:8000/v1)")
    path = parts.path.rstrip("/") or "/v1"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def request_for(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                tool: str = "", arguments: Mapping[str, Any] | None = None,
                api: str = "completions", desc_chars: int = 80) -> dict[str, Any]:
    """The request body (less model and sampling) asking for the next tool response."""
    if api == "completions":
        return {"prompt": chat.render(messages, tools, generation_prompt="tool",
                                      desc_chars=desc_chars)}
    if api == "chat":
        convo = chat.render(messages, tools, desc_chars=desc_chars)
        call = f"{tool}({json.dumps(dict(arguments or {}), ensure_ascii=False)})"
        return {"messages": [{"role": "system", "content": CHAT_SYSTEM},
                             {"role": "user", "content": f"{convo}\nCall: {call}\nResponse:"}]}
    raise ValueError(f"api must be one of {', '.join(APIS)}, not {api!r}")


def _abort(held: list[socket.socket]) -> None:
    """Wake a thread blocked on a request's socket (it then fails at once)."""
    for sock in list(held):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_REASON else text[:MAX_REASON] + "..."


class EndpointClient:
    """Greedy requests to one served model, with timeouts, bounded retries and backoff."""

    def __init__(self, base_url: str, model: str, api: str = "completions",
                 max_tokens: int = 256, timeout_s: float = 60.0, retries: int = 3,
                 backoff_s: float = 0.5, max_backoff_s: float = 8.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, not {api!r}")
        if retries < 0 or timeout_s <= 0 or max_tokens < 1:
            raise ValueError("need retries >= 0, timeout_s > 0 and max_tokens >= 1")
        self.base, self.model, self.api = normalize_base(base_url), model, api
        self.max_tokens, self.timeout_s, self.retries = max_tokens, timeout_s, retries
        self.backoff_s, self.max_backoff_s, self._sleep = backoff_s, max_backoff_s, sleep
        self.label = f"endpoint:{self.base}#{model}"
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if os.environ.get(API_KEY_ENV):
            self.headers["Authorization"] = f"Bearer {os.environ[API_KEY_ENV]}"
        self._live: list[list[socket.socket]] = []
        self._live_lock = threading.Lock()
        self._closing = False

    # ------------------------------------------------------------ one HTTP exchange

    def _http(self, path: str, body: Mapping[str, Any] | None) -> Any:
        """One exchange with the configured server, bounded as a whole by ``timeout_s``
        (connect, headers and body: a server that drips bytes is cut off at the deadline). A
        redirect is never followed: only the configured endpoint is contacted, and the key
        never goes anywhere else."""
        url = self.base + path
        parts = urllib.parse.urlsplit(url)
        data = None if body is None else json.dumps(body).encode()
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname, parts.port, timeout=self.timeout_s)
        expired = threading.Event()
        held: list[socket.socket] = []  # the socket (a response that closes takes it from conn)

        def _expire() -> None:
            expired.set()
            _abort(held)

        timer = threading.Timer(self.timeout_s, _expire)
        timer.daemon = True
        with self._live_lock:
            self._live.append(held)
        timer.start()
        try:
            conn.connect()
            held.append(conn.sock)
            if expired.is_set() or self._closing:
                _abort(held)
            conn.request("GET" if body is None else "POST", parts.path, body=data,
                         headers=self.headers)
            resp = conn.getresponse()
            raw = resp.read(MAX_ANSWER_BYTES + 1)
            status, location = resp.status, resp.getheader("Location")
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            if expired.is_set() or isinstance(exc, TimeoutError):
                raise _Failure(f"no answer from {url} within {self.timeout_s:g} s",
                               True) from None
            if self._closing:
                raise _Failure(f"request to {url} abandoned (interrupted)", False) from None
            if isinstance(exc, ConnectionRefusedError | socket.gaierror):
                raise _Failure(f"cannot reach {url}: {exc}", True) from None
            raise _Failure(f"connection to {url} failed: {exc}", True) from None
        finally:
            timer.cancel()
            with self._live_lock:
                self._live.remove(held)
            conn.close()
            for sock in held:
                sock.close()
        if expired.is_set():
            raise _Failure(f"no answer from {url} within {self.timeout_s:g} s", True)
        if len(raw) > MAX_ANSWER_BYTES:  # not retried: the same request would answer the same
            raise _Failure(f"answer from {url} passes the {MAX_ANSWER_BYTES}-byte limit of an "
                           "answer: refused", False)
        if 300 <= status < 400:
            raise _Failure(f"HTTP {status} from {url}: a redirect (to "
                           f"{_short(location or '?')}) is not followed: only the configured "
                           "endpoint is contacted", False)
        if status >= 400:
            detail = _short(raw.decode("utf-8", "replace"))
            retry = status >= 500 or status in RETRY_STATUS
            raise _Failure(f"HTTP {status} from {url}: {detail}", retry)
        try:
            return json.loads(raw)
        except ValueError:
            shown = _short(raw.decode("utf-8", "replace")) or "(empty)"
            raise _Failure(f"answer from {url} is not JSON: {shown}", True) from None
        except RecursionError:  # not retried: the same request would answer the same
            raise _Failure(f"answer from {url} is nested too deeply to read", False) from None

    def abort(self) -> None:
        """End every request in flight now (Ctrl-C: threads must not wait for a timeout)."""
        self._closing = True
        with self._live_lock:
            live = list(self._live)
        for held in live:
            _abort(held)

    def _text(self, data: Any) -> str:
        """The generated text of a decoded answer; `_Failure` (retried) for a wrong schema."""
        try:
            choice = data["choices"][0]
            text = choice["text"] if self.api == "completions" else choice["message"]["content"]
        except (KeyError, IndexError, TypeError):
            where = "choices[0].text" if self.api == "completions" else \
                "choices[0].message.content"
            raise _Failure(f"answer has no {where}: {_short(json.dumps(data))}", True) from None
        if not isinstance(text, str):
            raise _Failure(f"answer's text is {type(text).__name__}, not a string", True)
        return text

    # ------------------------------------------------------------ requests

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (1, 2, ...): exponential, capped."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))

    def ask(self, request: Mapping[str, Any]) -> Answer:
        """One request (`request_for`), retried as the module says; never raises for HTTP."""
        body = {"model": self.model, "temperature": 0, "max_tokens": self.max_tokens,
                **request}
        if self.api == "completions":
            body["stop"] = [chat.IM_END]
        path = "/completions" if self.api == "completions" else "/chat/completions"
        attempt = 0
        while True:
            attempt += 1
            try:
                text = self._text(self._http(path, body))
                return Answer(text.split(chat.IM_END, 1)[0], None, attempt)
            except _Failure as exc:
                if not exc.retry or attempt > self.retries or self._closing:
                    return Answer(None, exc.reason, attempt)
                self._sleep(self.delay(attempt))

    def post(self, path: str, body: Mapping[str, Any]) -> tuple[Any, str | None, int]:
        """One JSON POST with the retries of `ask` (the likelihood audit's prompt log-probability
        requests): ``(decoded answer, None, attempts)`` or ``(None, last failure, attempts)``."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._http(path, body), None, attempt
            except _Failure as exc:
                if not exc.retry or attempt > self.retries or self._closing:
                    return None, exc.reason, attempt
                self._sleep(self.delay(attempt))

    def answer_all(self, requests: Sequence[Mapping[str, Any]], concurrency: int = 4,
                   progress: Callable[[int], None] | None = None) -> list[Answer]:
        """Every request's answer, in order; at most `concurrency` requests in flight."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        lock = threading.Lock()
        done = [0]

        def one(req: Mapping[str, Any]) -> Answer:
            ans = self.ask(req)
            if progress is not None:
                with lock:
                    done[0] += 1
                    progress(done[0])
            return ans

        pool = ThreadPoolExecutor(max_workers=concurrency)
        try:
            out = list(pool.map(one, requests))
        except BaseException:  # Ctrl-C: cut the requests in flight, do not wait for them
            pool.shutdown(wait=False, cancel_futures=True)
            self.abort()
            raise
        pool.shutdown(wait=True)
        return out

    def check(self) -> list[str]:
        """The served model ids (`GET /models`, one attempt); `EndpointError` if unusable.

        A server without `/models` (404) passes: the first request will tell.
        """
        try:
            data = self._http("/models", None)
        except _Failure as exc:
            if exc.reason.startswith("HTTP 404"):
                return []
            raise EndpointError(f"no usable OpenAI-compatible server at {self.base}: "
                                f"{exc.reason}") from None
        try:
            ids = [str(m["id"]) for m in data["data"]]
        except (KeyError, TypeError):
            raise EndpointError(f"{self.base}/models does not answer an OpenAI model list: "
                                f"{_short(json.dumps(data))}") from None
        if ids and self.model and self.model not in ids:
            raise EndpointError(f"{self.base} does not serve model {self.model!r} "
                                f"(it serves: {', '.join(ids[:10])})")
        return ids
