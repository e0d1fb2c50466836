"""The world-model callable: one type for everything that writes a tool response.

    def world_model(messages, tools, tool, arguments) -> str

`messages` is the conversation so far as chat dicts (`envace.core.schema.Message.dump()` shape),
`tools` the tool schemas offered (or None when a file did not record them), `tool` and
`arguments` the call to answer; the return value is the response text. A trained policy
rehearsing, a frozen local model (`envace.model.simulators.ModelSimulator`), a served model
(`EndpointSimulator`, `envace.evaluation.endpoint_probe`), a lookup of training responses
(`audit.worlds.reference`) and the teacher-forced probe's recorders all have this shape: rollouts
take one as their simulator and the audit's probe takes one as the model under audit.

A world model that has no answer for a step (a served model that timed out) raises
`Unanswered(reason)`; the probe records the step as unanswered with that reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: (messages so far, tool schemas or None, tool name, arguments) -> response text
WorldModel = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, str, dict[str, Any]], str]


class Unanswered(Exception):
    """Raised by a world model that has no answer for a step; the message is the reason."""


def from_lookup(reference: Callable[[str, dict[str, Any]], str]) -> WorldModel:
    """A `(tool, arguments) -> text` reference (a lookup table) as a world model: no history."""
    return lambda messages, tools, tool, arguments: reference(tool, arguments)
