"""Tool calls in a finished assistant message: the JSON forms.

``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen 2.5/3, Hermes), and a
message that is nothing but ``{"name": ..., "parameters": {...}}`` objects (Llama 3.x,
optionally after ``<|python_tag|>``). Anything that does not parse stays content: a call is
never invented.
"""

from __future__ import annotations

import json
import re
import secrets

from homelab.server.pieces import ToolCall

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


def _new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def _tool_call_from_object(obj: object) -> ToolCall | None:
    """``{"name": str, "arguments"|"parameters": object-or-JSON-text}`` or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    key = "arguments" if "arguments" in obj else "parameters"
    arguments = obj.get(key, {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(_new_call_id(), obj["name"], json.dumps(arguments, ensure_ascii=False))


def _parse_tagged_calls(text: str) -> tuple[str, list[ToolCall]]:
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = 0
    for match in _TOOL_CALL_BLOCK.finditer(text):
        try:
            call = _tool_call_from_object(json.loads(match.group(1)))
        except json.JSONDecodeError:
            call = None
        kept.append(text[position : match.start()] if call else text[position : match.end()])
        position = match.end()
        if call:
            calls.append(call)
    kept.append(text[position:])
    return "".join(kept).strip() if calls else text, calls


def _parse_llama3_calls(text: str) -> list[ToolCall] | None:
    """The whole message is one or more ``{"name", "parameters"}`` objects (``;``-separated)."""
    body = text.strip()
    body = body.removeprefix(_PYTHON_TAG).strip()
    if not body.startswith("{"):
        return None
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    position = 0
    while position < len(body):
        try:
            obj, position = decoder.raw_decode(body, position)
        except json.JSONDecodeError:
            return None
        call = _tool_call_from_object(obj)
        if call is None:
            return None
        calls.append(call)
        while position < len(body) and body[position] in " \t\r\n;":
            position += 1
    return calls


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Split an assistant message into (content, tool calls).

    Call this only when tools were offered: a model asked to answer in JSON may produce
    text that looks like a Llama 3 tool call. Anything that does not parse stays content.
    """
    if "<tool_call>" in text:
        content, calls = _parse_tagged_calls(text)
        if calls:
            return content, calls
    llama3_calls = _parse_llama3_calls(text)
    if llama3_calls:
        return "", llama3_calls
    return text, []
