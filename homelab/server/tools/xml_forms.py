"""Formats that write each argument as raw text between tags, typed by the tool's schema:
Qwen3-Coder / Qwen3.5 / Nemotron 3 / StepFun / Seed-OSS (``<function=NAME><parameter=K>``),
GLM 4.5+ and its kin (``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>``),
MiniMax-M2 (``<invoke name="NAME"><parameter name="K">``), DeepSeek V3.2/V4 (DSML),
MiniCPM 5 (``<function name=…><param name=…>``), Hunyuan 3 (``<tool_call:opensource>``).

Arguments stream as JSON built from the tags: ``{"K": `` once a parameter opens, a string
value character by character (minus what could still be its closing tag), other values when
their tag closes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from homelab.server.tools.formats import (
    MarkedCalls,
    PartialCall,
    name_until,
    require_name,
)
from homelab.server.tools.scan import (
    Malformed,
    could_become,
    held_suffix,
    skip_space,
    string_prefix,
)
from homelab.server.tools.toolset import ToolSet, json_or_text

_CDATA = "<![CDATA["


@dataclass(kw_only=True)
class TaggedArgs(MarkedCalls):
    """One family's tags: ``call_open NAME name_end`` then, per parameter,
    ``key_open KEY key_end value_open VALUE value_close``, then ``call_close`` — alone or
    inside a ``section`` (see the module docstring for the shapes)."""

    name: str
    call_open: str
    name_ends: tuple[str, ...]
    key_open: str
    key_ends: tuple[str, ...]  # a key ends at one of these ...
    value_open: str  # ... then this comes (GLM: "<arg_value>") ...
    value_close: str  # ... then the value up to this
    call_close: str
    section: tuple[str, str | None] | None = None
    trim_newline: bool = False  # Qwen3-Coder puts the value on its own lines
    string_ends: tuple[str, ...] = ()  # key ends that say "this value is a string" (DSML)
    json_ends: tuple[str, ...] = ()  # key ends that say "this value is JSON"
    cdata: bool = False  # MiniCPM wraps text with markup in <![CDATA[...]]>

    def read_call(
        self, text: str, pos: int, tools: ToolSet
    ) -> tuple[PartialCall | None, int | None]:
        found = name_until(text, pos, self.name_ends)
        if found is None:
            return None, None
        raw_name, at, end_mark = found
        call = PartialCall(require_name(raw_name.strip(), tools), args="{")
        if end_mark not in (self.key_open, self.call_close):
            at += len(end_mark)
        values = _Written()
        while True:
            at = skip_space(text, at)
            if text.startswith(self.call_close, at):
                call.arguments = values.values
                call.args = values.so_far() + "}"
                return call, at + len(self.call_close)
            if text.startswith(self.key_open, at):
                step = self._parameter(text, at + len(self.key_open), call, values, tools)
                if step is None:
                    return call, None
                at = step
                continue
            if at == len(text) or could_become(text[at:], (self.call_close, self.key_open)):
                return call, None
            raise Malformed(f"unexpected text in a call: {text[at : at + 30]!r}")

    def _parameter(
        self, text: str, pos: int, call: PartialCall, values: _Written, tools: ToolSet
    ) -> int | None:
        """Reads one parameter into ``values`` (and the streamable ``call.args``); returns
        where it ends, or None while it is incomplete."""
        found = name_until(text, pos, self.key_ends)
        if found is None:
            return None
        key, at, key_end = found
        key = key.strip()
        at += len(key_end)
        if self.value_open:
            at = skip_space(text, at)
            if not text.startswith(self.value_open, at):
                if could_become(text[at:], (self.value_open,)) or at == len(text):
                    return None
                raise Malformed(f"{self.value_open} expected")
            at += len(self.value_open)
        is_string = key_end in self.string_ends or (
            key_end not in self.json_ends and tools.type_of(call.name, key) == "string"
        )
        close = text.find(self.value_close, at)
        if close < 0:
            partial = self._partial(text[at:]) if is_string else None
            if partial is not None:
                call.args = values.so_far(f"{json.dumps(key, ensure_ascii=False)}: {partial}")
            return None
        raw = self._trim(text[at:close])
        values.add(key, raw if is_string else self._typed(call.name, key, raw, key_end, tools))
        call.args = values.so_far()
        return close + len(self.value_close)

    def _typed(self, tool: str, key: str, raw: str, key_end: str, tools: ToolSet) -> Any:
        if key_end in self.json_ends:
            return json_or_text(raw)
        return tools.value(tool, key, raw)

    def _partial(self, raw: str) -> str | None:
        """A string value still being written, minus what may be its closing tag (and the
        newline Qwen3-Coder puts before it), as the start of a JSON string."""
        if self.cdata and (raw.startswith(_CDATA) or could_become(raw, (_CDATA,))):
            return None  # wrapped text streams whole (its end marker is two markers long)
        keep = held_suffix(raw, (self.value_close, "\n" + self.value_close))
        raw = raw[: len(raw) - keep]
        if self.trim_newline:
            if raw in ("", "\n"):
                return None  # the leading newline may be the one the template adds
            raw = raw.removeprefix("\n")
        return string_prefix(raw)

    def _trim(self, raw: str) -> str:
        if self.cdata and raw.startswith(_CDATA) and raw.endswith("]]>"):
            return raw[len(_CDATA) : -3]
        if self.trim_newline:
            raw = raw.removeprefix("\n")
            raw = raw.removesuffix("\n")
        return raw


class _Written:
    """A call's parameters as they were written: the values (a repeated parameter's last
    one wins, as JSON parsers read a repeated key) and the object's text, which only ever
    grows (the repeat is written again), so the streamed fragments stay a prefix of it."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self._members: list[str] = []

    def add(self, key: str, value: Any) -> None:
        self.values[key] = value
        member = json.dumps({key: value}, ensure_ascii=False, allow_nan=False)[1:-1]
        self._members.append(member)

    def so_far(self, partial: str = "") -> str:
        """The object so far, left open for more: ``{"a": 1`` (or ``{`` when empty)."""
        return "{" + ", ".join([*self._members, *([partial] if partial else [])])
