"""Tool calls: which syntax a model writes, parsing it (whole or streamed), forcing a call.

Layers, top to bottom (the import-linter contract "homelab.server.tools layers"):

- :mod:`grammar`: ``tool_choice`` required / named -> a GBNF grammar in the model's syntax;
- :mod:`stream`: text arriving token by token -> content, call starts, argument fragments,
  whole calls (a finished message goes through it too: :func:`split_tool_calls`);
- :mod:`detect`: the chat template -> the model's format (the registry of families);
- :mod:`json_forms`, :mod:`xml_forms`, :mod:`python_forms`: one parser per family shape;
- :mod:`formats`: what a format offers the stream (markers, a region scanner);
- :mod:`scan`, :mod:`toolset`: shared scanners; the offered tools and their parameter types.
"""

from homelab.server.pieces import ContentDelta, ToolCall, ToolCallArgs, ToolCallStart
from homelab.server.tools.detect import FORMATS, GENERIC, Detected, detect_tool_format
from homelab.server.tools.formats import ToolFormat
from homelab.server.tools.grammar import forced_call_grammar
from homelab.server.tools.stream import Piece, ToolCallStream, split_tool_calls
from homelab.server.tools.toolset import ToolSet

__all__ = [
    "FORMATS",
    "GENERIC",
    "ContentDelta",
    "Detected",
    "Piece",
    "ToolCall",
    "ToolCallArgs",
    "ToolCallStart",
    "ToolCallStream",
    "ToolFormat",
    "ToolSet",
    "detect_tool_format",
    "forced_call_grammar",
    "split_tool_calls",
]
