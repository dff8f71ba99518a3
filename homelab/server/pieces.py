"""The pieces a reply is parsed into: answer text, reasoning, tool calls.

The reasoning splitter (:mod:`homelab.server.reasoning`) and the tool-call parser
(:mod:`homelab.server.tools`) produce them; every dialect turns them into its wire shape.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ContentDelta:
    """Answer text."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """Reasoning ("thinking") text."""

    text: str


@dataclass(frozen=True)
class ToolCall:
    """A whole tool call the model wrote."""

    id: str
    name: str
    arguments_json: str  # a JSON object, as text (OpenAI's ``function.arguments``)


ReplyPiece = ReasoningDelta | ContentDelta | ToolCall
