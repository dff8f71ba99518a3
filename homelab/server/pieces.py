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


@dataclass(frozen=True)
class ToolCallStart:
    """A call the model has begun to write: its name is known, its arguments follow as
    :class:`ToolCallArgs` fragments, and the whole :class:`ToolCall` closes it."""

    index: int  # the call's position in the reply (0, 1, ...)
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgs:
    """The next fragment of a started call's arguments (JSON text; the fragments of one call
    concatenate to a JSON object equal to its :attr:`ToolCall.arguments_json`)."""

    index: int
    fragment: str


ReplyPiece = ReasoningDelta | ContentDelta | ToolCall
StreamPiece = ReplyPiece | ToolCallStart | ToolCallArgs  # what the streaming writers read
