"""A conversation's history made stable for the prefix cache, before the template renders it.

An agent resends its whole conversation every turn; the engine reuses the slot's tokens up to
the first one that differs. Two things make a resent history differ from what the slot holds
although nothing meaningful changed:

- **Volatile client blocks.** Claude Code (>= 2.1.36) puts a system block
  ``x-anthropic-billing-header: cc_version=…; cch=<5 hex>;`` first and changes it on every
  request, so the prompt differed from its second token on. Such text is removed from system
  messages by regular expressions (:data:`DEFAULT_VOLATILE_PATTERNS` plus the server's own,
  ``--strip-pattern``), and the removal is logged at debug level.
- **Reasoning the model wrote.** The slot holds the model's thinking; a history that omits it
  diverges right after the last user turn. Each assistant turn's ``reasoning_content`` (chat's
  field, Anthropic's thinking blocks, the Responses API's reasoning items) is kept in the
  template's messages so templates that render it (Qwen3, GLM, gpt-oss, DeepSeek…) give the
  same tokens back; ``--no-history-reasoning`` drops it instead.

Templates that iterate a tool call's arguments get them as objects (:func:`with_object_arguments`)
instead of refusing the conversation.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("homelab.server.history")

# Claude Code's per-request attribution line (a system block of its own, joined by "\n")
BILLING_HEADER = r"(?m)^x-anthropic-billing-header:[^\n]*(?:\n|$)"
DEFAULT_VOLATILE_PATTERNS: tuple[str, ...] = (BILLING_HEADER,)


@functools.lru_cache(maxsize=64)
def compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    """The patterns compiled once per server (raises ``re.error`` for a bad one)."""
    return tuple(re.compile(pattern) for pattern in patterns)


def stable_messages(
    messages: Sequence[dict[str, Any]], patterns: tuple[str, ...], keep_reasoning: bool
) -> list[dict[str, Any]]:
    """``messages`` without volatile system text (a system message left empty is dropped),
    and without earlier reasoning unless ``keep_reasoning``. The input is not changed."""
    regexes = compiled(patterns)
    out: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "system" and regexes:
            kept = _without_volatile(message, regexes)
            if kept is None:
                continue
            message = kept
        if not keep_reasoning and "reasoning_content" in message:
            message = {k: v for k, v in message.items() if k != "reasoning_content"}
        out.append(message)
    return out


def _without_volatile(
    message: dict[str, Any], regexes: tuple[re.Pattern[str], ...]
) -> dict[str, Any] | None:
    text = message.get("content")
    if not isinstance(text, str) or not text:
        return message
    stripped = text
    for regex in regexes:
        stripped = regex.sub("", stripped)
    if stripped == text:
        return message
    log.debug("removed %d volatile characters from a system message", len(text) - len(stripped))
    if not stripped.strip():
        return None
    return {**message, "content": stripped}


# --- tool-call arguments as the template reads them -------------------------------------------

_ITERATES_ARGUMENTS = re.compile(
    r"arguments\s*\|\s*items|arguments\.items\(\)|(?:_args|arguments)\s+is\s+(?:not\s+)?mapping"
)
_ENCODES_ARGUMENTS = re.compile(r"arguments\s*\|\s*tojson")
_TAKES_TEXT = re.compile(r"arguments\s+is\s+string")


@functools.lru_cache(maxsize=16)
def wants_object_arguments(template_source: str) -> bool:
    """Templates that iterate a call's arguments (GLM's ``_args.items()``, Qwen3-Coder's
    ``arguments|items``) or ``tojson`` them without a branch for text (gpt-oss: the text
    would be quoted twice) need an object, as llama.cpp passes it; the others get the JSON
    text the client sent back, which renders exactly as the model wrote it."""
    if _ITERATES_ARGUMENTS.search(template_source):
        return True
    encodes = _ENCODES_ARGUMENTS.search(template_source) is not None
    return encodes and _TAKES_TEXT.search(template_source) is None


def with_object_arguments(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each tool call's JSON-object arguments parsed (others left as sent)."""
    return [
        {**m, "tool_calls": [_parsed_call(call) for call in m["tool_calls"]]}
        if m.get("tool_calls")
        else m
        for m in messages
    ]


def _parsed_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    if not isinstance(arguments, dict):
        return call
    return {**call, "function": {**function, "arguments": arguments}}


def wants_thinking_field(template_source: str) -> bool:
    """gpt-oss's template reads earlier reasoning from ``thinking``, not ``reasoning_content``
    (llama.cpp renames it the same way)."""
    return "message.thinking" in template_source and "reasoning_content" not in template_source


def with_thinking_field(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``reasoning_content`` as ``thinking``; a tool-call turn with both text and reasoning
    keeps the reasoning (the template refuses both)."""
    out = []
    for message in messages:
        reasoning = message.get("reasoning_content")
        if reasoning:
            message = {k: v for k, v in message.items() if k != "reasoning_content"}
            message["thinking"] = reasoning
            if message.get("tool_calls") and message.get("content"):
                message["content"] = ""
        out.append(message)
    return out
