"""Simulators for mode ``simulator``: tool responses from a frozen model or an endpoint.

A simulator is a callable ``(messages, tools, tool, arguments) -> response text``. The policy
never trains on what it writes (its tokens enter the policy's context as CONTEXT).

- :class:`ModelSimulator`: a local model, prompted with the conversation so far and a forced
  tool header, greedy until ``<|im_end|>``.
- :class:`EndpointSimulator`: an OpenAI-compatible ``/v1/chat/completions`` endpoint (e.g. a vLLM
  server), asked to answer as the tool. Only the URL the user configured is contacted.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import torch

from envace import chat


class ModelSimulator:
    """A frozen local model playing the environment."""

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int = 256,
                 desc_chars: int = 60) -> None:
        self.model, self.tok = model.eval(), tokenizer
        self.max_new_tokens, self.desc_chars = max_new_tokens, desc_chars
        self.im_end = chat.marker_id(tokenizer, chat.IM_END)

    @torch.no_grad()
    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], tool: str,
                 arguments: dict[str, Any]) -> str:
        ids, _ = chat.encode_with_roles(self.tok, messages, tools, generation_prompt="tool",
                                        desc_chars=self.desc_chars)
        out = self.model.generate(torch.tensor([ids]), max_new_tokens=self.max_new_tokens,
                                  do_sample=False, eos_token_id=self.im_end,
                                  pad_token_id=self.tok.pad_token_id or self.im_end)
        text = self.tok.decode(out[0, len(ids):], skip_special_tokens=False)
        return text.split(chat.IM_END, 1)[0]


class EndpointSimulator:
    """An OpenAI-compatible chat endpoint playing the environment."""

    SYSTEM = ("You simulate a tool backend. Given the conversation and the latest tool call, "
              "reply with only the tool's response (JSON), nothing else.")

    def __init__(self, base_url: str, model: str = "default", timeout_s: float = 60.0,
                 max_tokens: int = 256) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.timeout_s, self.max_tokens = model, timeout_s, max_tokens

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], tool: str,
                 arguments: dict[str, Any]) -> str:
        prompt = chat.render(messages, tools)
        body = {"model": self.model, "temperature": 0, "max_tokens": self.max_tokens,
                "messages": [{"role": "system", "content": self.SYSTEM},
                             {"role": "user", "content": f"{prompt}\nCall: {tool}"
                              f"({json.dumps(arguments)})\nResponse:"}]}
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                data = json.loads(resp.read())
            return str(data["choices"][0]["message"]["content"])
        except Exception as exc:  # an unreachable simulator answers with an error, as data
            return json.dumps({"error": f"simulator endpoint failed: {exc}"})
