"""What a chat template makes of requests and replies, for ``homelab template``: the tool-call
format and reasoning style detected from it, the exact prompt a chat request becomes, and
the parse of a model's output — the same functions the server runs, without a model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from homelab.engine.api import TokenEvent
from homelab.engine.chat_template import ChatTemplate
from homelab.server.chat import chat_inputs
from homelab.server.pieces import ContentDelta, ReasoningDelta, ToolCall
from homelab.server.protocol import ChatCompletionRequest
from homelab.server.reasoning import detect_reasoning, thinking_switches
from homelab.server.replies import ReplyStream
from homelab.server.tools import ToolSet, detect_tool_format


@dataclass(frozen=True)
class TemplateFacts:
    """What the template's text says about the model."""

    tool_format: str  # "qwen3-coder", … or "generic (not recognised)"
    tool_format_known: bool
    reasoning: str  # "think", "harmony" or "none"
    supports_tools: bool
    markers: tuple[str, ...]  # the text that opens a call, and reasoning tags
    special_tokens: Mapping[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "tool_format": self.tool_format,
            "tool_format_known": self.tool_format_known,
            "reasoning": self.reasoning,
            "supports_tools": self.supports_tools,
            "markers": list(self.markers),
            "special_tokens": dict(self.special_tokens),
        }


def template_facts(
    template: ChatTemplate, special_tokens: Mapping[str, str] | None = None
) -> TemplateFacts:
    detected = detect_tool_format(template.source)
    reasoning = detect_reasoning(template.source)
    markers = detected.format.markers() + (reasoning.markers if reasoning else ())
    return TemplateFacts(
        detected.name,
        detected.known,
        reasoning.style if reasoning else "none",
        template.supports_tools,
        tuple(dict.fromkeys(markers)),
        dict(special_tokens or {}),
    )


def _request(body: Mapping[str, Any]) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "local", **body})


def rendered_prompt(template: ChatTemplate, body: Mapping[str, Any]) -> str:
    """The exact text a Chat Completions request body becomes (tools, thinking switches and
    ``chat_template_kwargs`` applied), as the server renders it."""
    inputs = chat_inputs(_request(body))
    tools = inputs.tools if inputs.tools and inputs.tool_choice != "none" else None
    switches = thinking_switches(
        template.source,
        inputs.template_kwargs,
        enable_thinking=inputs.enable_thinking,
        reasoning_effort=inputs.reasoning_effort,
    )
    text = template.render(inputs.messages, tools=tools, add_generation_prompt=True, **switches)
    return text + inputs.prefill


def parsed_output(
    template: ChatTemplate, output: str, body: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A model's output parsed as the server parses a reply: reasoning, content, calls (to
    the request's tools when a request is given, else to any name)."""
    tools = chat_inputs(_request(body)).tools if body else None
    reasoning = detect_reasoning(template.source)
    prompt = rendered_prompt(template, body) if body else ""
    stream = ReplyStream(
        reasoning,
        opened=reasoning.opened_by(prompt) if reasoning else False,
        parse_tools=True,
        tool_format=detect_tool_format(template.source).format,
        tools=ToolSet.of(tools),
    )
    pieces = stream.feed(TokenEvent(output, 0)) + stream.finish()
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    content = "".join(p.text for p in pieces if isinstance(p, ContentDelta))
    return {
        "format": detect_tool_format(template.source).name,
        "content": content.strip() if calls else content,
        "reasoning": "".join(p.text for p in pieces if isinstance(p, ReasoningDelta)),
        "tool_calls": [{"name": c.name, "arguments": json.loads(c.arguments_json)} for c in calls],
    }
