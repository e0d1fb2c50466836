"""Simulators for mode ``simulator``: tool responses from a frozen model or an endpoint.

A simulator is a callable ``(messages, tools, tool, arguments) -> response text``. The policy
never trains on what it writes (its tokens enter the policy's context as CONTEXT).

- :class:`ModelSimulator`: a local model, prompted with the conversation so far and a forced
  tool header, greedy until ``<|im_end|>``.
- :class:`EndpointSimulator`: an OpenAI-compatible server (e.g. vLLM) through
  `envace.model.endpoint` (``/v1/completions`` with envace's prompt, or ``/v1/chat/completions``).
  Only the URL the user configured is contacted. This module imports torch only to generate.

    sim = EndpointSimulator("http://127.0.0.1:8000/v1", "smollm2", api="completions")
    sim.check(); text = sim(messages, tools, "ls", {})
    sim = connect_endpoint(*split_endpoint_spec("http://127.0.0.1:8000/v1#smollm2"))  # checked

A training config names a served simulator as ``simulator_model=http://HOST:PORT/v1#MODEL``
(``#MODEL`` may be left out when the server serves one model); ``envace rollout`` as
``--simulator-endpoint URL [--simulator-model NAME]``. Both check the server before the policy
is loaded and ask with the ``completions`` API by default (envace's own prompt).
"""

from __future__ import annotations

import json
from typing import Any

from envace.model import chat
from envace.model.endpoint import EndpointClient, EndpointError, request_for
from envace.model.models import default_cache_dir, load_model, resolve_model


class ModelSimulator:
    """A frozen local model playing the environment."""

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int = 256,
                 desc_chars: int = 60) -> None:
        self.model, self.tok = model.eval(), tokenizer
        self.max_new_tokens, self.desc_chars = max_new_tokens, desc_chars
        self.im_end = chat.marker_id(tokenizer, chat.IM_END)

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], tool: str,
                 arguments: dict[str, Any]) -> str:
        import torch

        ids, _ = chat.encode_with_roles(self.tok, messages, tools, generation_prompt="tool",
                                        desc_chars=self.desc_chars)
        with torch.no_grad():
            out = self.model.generate(torch.tensor([ids]), max_new_tokens=self.max_new_tokens,
                                      do_sample=False, eos_token_id=self.im_end,
                                      pad_token_id=self.tok.pad_token_id or self.im_end)
        text = self.tok.decode(out[0, len(ids):], skip_special_tokens=False)
        return text.split(chat.IM_END, 1)[0]


class EndpointSimulator:
    """An OpenAI-compatible server playing the environment (`envace.model.endpoint.EndpointClient`).

    `api="completions"` sends envace's own ChatML prompt with an open tool header (what a model
    trained here rehearses from, as `ModelSimulator` does); `api="chat"` asks a chat model to
    answer as the tool. Greedy; timeouts, 5xx and malformed answers are retried with backoff. A
    request that still fails answers an error as data (`{"error": "simulator endpoint failed:
    ..."}`), counted in `failures`, so an episode goes on and the audit sees the error.
    """

    def __init__(self, base_url: str, model: str = "default", timeout_s: float = 60.0,
                 max_tokens: int = 256, api: str = "chat", retries: int = 3,
                 desc_chars: int = 80) -> None:
        self.client = EndpointClient(base_url, model, api=api, max_tokens=max_tokens,
                                     timeout_s=timeout_s, retries=retries)
        self.desc_chars, self.failures, self.calls = desc_chars, 0, 0
        self.last_error: str | None = None
        self.label = self.client.label

    def check(self) -> None:
        """Raise `envace.model.endpoint.EndpointError` when the server cannot be used."""
        self.client.check()

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], tool: str,
                 arguments: dict[str, Any]) -> str:
        req = request_for(messages, tools, tool, arguments, self.client.api, self.desc_chars)
        ans = self.client.ask(req)
        self.calls += 1
        if ans.text is None:
            self.failures += 1
            self.last_error = ans.error
            return json.dumps({"error": f"simulator endpoint failed: {ans.error}"})
        return ans.text


def split_endpoint_spec(spec: str) -> tuple[str, str]:
    """A served simulator's spec ``http(s)://HOST:PORT/v1#MODEL`` as (URL, model); the model is
    ``""`` when the spec names none (then the server's only model is used)."""
    url, _, model = spec.partition("#")
    return url, model.strip()


def connect_endpoint(url: str, model: str = "", *, api: str = "completions",
                     timeout_s: float = 60.0, max_tokens: int = 256, retries: int = 3,
                     desc_chars: int = 80) -> EndpointSimulator:
    """A checked :class:`EndpointSimulator`: the server answers an OpenAI model list and serves
    ``model`` (with no model named: the only model it serves). Raises
    ``envace.model.endpoint.EndpointError`` (down, not OpenAI-compatible, model not served, or
    several models and none named) or ValueError (not an http(s) URL)."""
    def make(name: str) -> EndpointSimulator:
        return EndpointSimulator(url, name, timeout_s=timeout_s, max_tokens=max_tokens, api=api,
                                 retries=retries, desc_chars=desc_chars)

    sim = make(model)
    served = sim.client.check()
    if not model:
        if len(served) != 1:
            raise EndpointError(f"{sim.client.base} serves {len(served)} models "
                                f"({', '.join(served[:10])}): name the one to use")
        sim = make(served[0])
    return sim


def local_simulator(spec: str, max_new_tokens: int, desc_chars: int,
                    texts: list[str] | None = None) -> ModelSimulator:
    """A frozen local model as the simulator: a preset or a model folder (``texts``: what a
    ``tiny`` preset's tokenizer is trained on)."""
    model, tok = load_model(resolve_model(spec, default_cache_dir(), texts=texts))
    return ModelSimulator(model, tok, max_new_tokens, desc_chars)
