"""Finding tool calls in streamed output.

Two output forms are understood (parsing itself is
:func:`homelab.server.tools.calls.parse_tool_calls`):
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen, Hermes), and a
message that is nothing but ``{"name": ..., "parameters": {...}}`` objects (Llama 3.x).

:class:`ToolCallStream` turns text arriving token by token into content deltas and whole
tool calls: it releases text that cannot be the start of a ``<tool_call>`` block, buffers a
block until it closes, and buffers a message that *starts* with ``{`` to the end (it may be a
Llama 3 call).
"""

from __future__ import annotations

from homelab.server.pieces import ContentDelta, ToolCall
from homelab.server.tools.calls import parse_tool_calls

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"

Piece = ContentDelta | ToolCall


class ToolCallStream:
    def __init__(self) -> None:
        self._buffer = ""
        self._mode = "start"  # start -> content <-> call, or start -> whole (Llama 3 JSON)

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        return self._drain()

    def finish(self) -> list[Piece]:
        pieces: list[Piece] = []
        buffer, self._buffer = self._buffer, ""
        if self._mode == "whole":
            content, calls = parse_tool_calls(buffer)
            pieces = [ContentDelta(content)] if content else []
            return [*pieces, *calls]
        if self._mode == "call":
            return self._parse_block(OPEN_TAG + buffer + CLOSE_TAG, fallback=OPEN_TAG + buffer)
        return [ContentDelta(buffer)] if buffer else []

    def _drain(self) -> list[Piece]:
        if self._mode == "start":
            self._choose_mode()
        pieces: list[Piece] = []
        while self._mode in ("content", "call"):
            produced = self._step_content() if self._mode == "content" else self._step_call()
            if produced is None:  # needs more text
                break
            pieces += produced
        return [p for p in pieces if not (isinstance(p, ContentDelta) and not p.text)]

    def _choose_mode(self) -> None:
        head = self._buffer.lstrip()
        if not head:
            return
        if head.startswith("{") or head.startswith(PYTHON_TAG):
            self._mode = "whole"
        elif PYTHON_TAG.startswith(head) and len(head) < len(PYTHON_TAG):
            return  # could still become the python tag
        else:
            self._mode = "content"

    def _step_content(self) -> list[Piece] | None:
        at = self._buffer.find(OPEN_TAG)
        if at >= 0:
            before, self._buffer = self._buffer[:at], self._buffer[at + len(OPEN_TAG) :]
            self._mode = "call"
            return [ContentDelta(before)]
        keep = _longest_prefix_suffix(self._buffer, OPEN_TAG)
        cut = len(self._buffer) - keep
        released, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return [ContentDelta(released)] if released else None

    def _step_call(self) -> list[Piece] | None:
        at = self._buffer.find(CLOSE_TAG)
        if at < 0:
            return None
        block = OPEN_TAG + self._buffer[: at + len(CLOSE_TAG)]
        self._buffer = self._buffer[at + len(CLOSE_TAG) :]
        self._mode = "content"
        return self._parse_block(block, fallback=block)

    @staticmethod
    def _parse_block(block: str, fallback: str) -> list[Piece]:
        _, calls = parse_tool_calls(block)
        return list(calls) if calls else [ContentDelta(fallback)]


def _longest_prefix_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for length in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0


def split_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """A finished message as (content, calls), the same way the stream would split it."""
    stream = ToolCallStream()
    pieces = stream.feed(text) + stream.finish()
    content = "".join(p.text for p in pieces if isinstance(p, ContentDelta))
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    return (content.strip() if calls else content), calls
