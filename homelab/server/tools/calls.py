"""Tool calls in a finished assistant message, in the model's format (generic by default).

Anything that does not parse stays content: a call is never invented.
"""

from __future__ import annotations

from homelab.server.pieces import ToolCall
from homelab.server.tools.formats import ToolFormat
from homelab.server.tools.stream import split_tool_calls
from homelab.server.tools.toolset import ToolSet


def parse_tool_calls(
    text: str, tool_format: ToolFormat | None = None, tools: ToolSet | None = None
) -> tuple[str, list[ToolCall]]:
    """Split an assistant message into (content, tool calls).

    Call this only when tools were offered: a model asked to answer in JSON may produce
    text that looks like a Llama 3 tool call. Content is kept as written unless calls were
    found (then it is trimmed).
    """
    content, calls = split_tool_calls(text, tool_format, tools)
    return (content, calls) if calls else (text, [])
