"""Tool calls: parsing them from what the model writes (whole or streamed) and forcing them.

- :mod:`calls`: a finished message -> content + :class:`~homelab.server.pieces.ToolCall` items;
- :mod:`stream`: text arriving token by token -> content deltas and whole calls;
- :mod:`grammar`: ``tool_choice`` required / named -> a GBNF grammar.
"""

from homelab.server.pieces import ContentDelta, ToolCall
from homelab.server.tools.calls import parse_tool_calls
from homelab.server.tools.grammar import forced_call_grammar, uses_tagged_calls
from homelab.server.tools.stream import Piece, ToolCallStream, split_tool_calls

__all__ = [
    "ContentDelta",
    "Piece",
    "ToolCall",
    "ToolCallStream",
    "forced_call_grammar",
    "parse_tool_calls",
    "split_tool_calls",
    "uses_tagged_calls",
]
