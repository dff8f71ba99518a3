"""Formats whose arguments are JSON as the model writes them, so they stream as written.

- :class:`JsonObjects`: ``{"name": …, "arguments": {…}}`` objects (alone, in an array, or one
  per line) between two markers — Hermes/Qwen ``<tool_call>``, Apriel/MiniMax-M1
  ``<tool_calls>``, Nemotron ``<TOOLCALL>``, Command-R ``<|START_ACTION|>``, Apertus
  (``{"NAME": {…}}``), GigaChat ``<|function_call|>``, and bare Llama 3 JSON;
- :class:`NamedJson`: a name then a JSON object — Mistral ``[TOOL_CALLS]NAME[ARGS]{…}``,
  Kimi K2 ``<|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{…}``,
  Functionary ``<function=NAME>{…}</function>``, Solar ``<|tool_call:name|>NAME…``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from homelab.server.tools.formats import (
    MarkedCalls,
    PartialCall,
    Scan,
    ToolFormat,
    name_until,
    require_name,
    require_object,
)
from homelab.server.tools.scan import (
    Malformed,
    container_end,
    could_become,
    read_json,
    skip_space,
    value_end,
)
from homelab.server.tools.toolset import ToolSet

_SEPARATORS = re.compile(r"[\s,;\[\]]*")


@dataclass(kw_only=True)
class JsonObjects(ToolFormat):
    """Call objects after an opening marker, up to ``close`` (or, without one, to the end of
    the first value; ``whole`` formats must be the whole reply)."""

    name: str
    opener: str
    close: str | None
    name_keys: tuple[str, ...] = ("name",)
    args_keys: tuple[str, ...] = ("arguments", "parameters")
    name_is_key: bool = False  # Apertus: {"NAME": {arguments}}
    whole: bool = False  # Llama 3: the reply is nothing but calls
    array: bool = False  # the model writes the calls as a JSON array (a forced call too)
    id_key: str | None = None  # Command-R numbers its calls (written by a forced call)

    def __post_init__(self) -> None:
        if self.whole:
            self.at_start = (self.opener,)
        else:
            self.openers = (self.opener,)

    def scan(self, region: str, final: bool, tools: ToolSet) -> Scan:
        calls: list[PartialCall] = []
        pos = 0 if self.opener == "{" else len(self.opener)
        while True:
            at = _SEPARATORS.match(region, pos).end()  # type: ignore[union-attr]
            if self.close and region.startswith(self.close, at):
                return Scan(calls, end=at + len(self.close))
            if at < len(region) and region[at] == "{":
                call, end = self._object(region, at, tools)
                calls.append(call)
                if end is None:
                    return Scan(calls, failed="the call is not closed" if final else None)
                pos = end
                continue
            return self._after(region, at, pos, final, calls)

    def _after(self, region: str, at: int, pos: int, final: bool, calls: list[PartialCall]) -> Scan:
        """The text after the last call object: the end of the region, or not yet known."""
        rest = region[at:]
        if not rest:
            if not final:
                return Scan(calls)
            complete = bool(calls) and not self.close
            return Scan(calls, end=len(region)) if complete else Scan(calls, failed="not closed")
        if self.close and could_become(rest, (self.close,)):
            return Scan(calls, failed="the calls are not closed" if final else None)
        if self.close or not calls:
            return Scan(calls, failed=f"unexpected text in a call: {rest[:30]!r}")
        if self.whole:
            return Scan(calls, failed="text after the calls")
        return Scan(calls, end=pos)

    def _object(self, text: str, pos: int, tools: ToolSet) -> tuple[PartialCall, int | None]:
        call = PartialCall("")
        at = pos + 1
        while True:
            at = skip_space(text, at)
            if at >= len(text):
                break
            if text[at] == "}":
                return self._closed(call, at + 1)
            at += 1 if text[at] == "," else 0
            entry = self._entry(text, skip_space(text, at), call, tools)
            if entry is None:
                break
            at = entry
        return call, None

    def _entry(self, text: str, at: int, call: PartialCall, tools: ToolSet) -> int | None:
        """One ``"key": value``: where it ends, or None while incomplete. Sets the call's
        name and arguments (what has arrived of them, once the name is known)."""
        if at >= len(text):
            return None
        if text[at] != '"':
            raise Malformed("a JSON key expected")
        key_end = value_end(text, at)
        if key_end is None:
            return None
        key = read_json(text[at:key_end])
        if not isinstance(key, str):
            raise Malformed("a JSON key is not a string")
        if self.whole and key not in self.name_keys + self.args_keys:
            raise Malformed("a JSON answer, not a call")  # release it now, not at its end
        colon = skip_space(text, key_end)
        if colon >= len(text):
            return None
        if text[colon] != ":":
            raise Malformed("':' expected")
        value_at = skip_space(text, colon + 1)
        end = value_end(text, value_at)
        is_args = key in self.args_keys or self.name_is_key
        if self.name_is_key:
            call.name = require_name(key, tools)
        elif key in self.name_keys:
            if end is None:
                return None
            name = read_json(text[value_at:end])
            call.name = require_name(name if isinstance(name, str) else "", tools)
        if end is None:
            self._stream_args(text, call, value_at if is_args else None)
            return None
        if is_args:
            call.arguments = _arguments(read_json(text[value_at:end]))
            call.args = text[value_at:end] if text[value_at] == "{" else json.dumps(call.arguments)
        return end

    @staticmethod
    def _stream_args(text: str, call: PartialCall, args_at: int | None) -> None:
        """What the model has written of an object argument so far (if the name is known)."""
        if call.name and args_at is not None and text[args_at : args_at + 1] == "{":
            call.args = text[args_at:]

    @staticmethod
    def _closed(call: PartialCall, end: int) -> tuple[PartialCall, int]:
        if not call.name:
            raise Malformed("a call object without a tool name")
        if call.arguments is None:
            call.arguments, call.args = {}, "{}"
        return call, end


def _arguments(value: object) -> dict[str, object]:
    """Arguments as an object, or as a JSON string holding one (OpenAI's own shape)."""
    if isinstance(value, str):
        value = read_json(value)
    return require_object(value)


@dataclass(kw_only=True)
class NamedJson(MarkedCalls):
    """``call_open NAME name_end {json} close`` calls, alone or in a section."""

    name: str
    call_open: str
    name_end: str
    close: str | None = None
    section: tuple[str, str | None] | None = None
    skip_to: str | None = None  # Solar: an id comes first, then this marker, then the name
    clean: Callable[[str], str] = str.strip

    def read_call(
        self, text: str, pos: int, tools: ToolSet
    ) -> tuple[PartialCall | None, int | None]:
        if self.skip_to:
            found = name_until(text, pos, (self.skip_to,))
            if found is None:
                return None, None
            pos = found[1] + len(self.skip_to)
        found = name_until(text, pos, (self.name_end,))
        if found is None:
            return None, None
        call = PartialCall(require_name(self.clean(found[0]), tools))
        at = skip_space(text, found[1] + len(self.name_end))
        if at >= len(text):
            return call, None
        if text[at] != "{":
            raise Malformed("the arguments are not a JSON object")
        end = container_end(text, at)
        call.args = text[at : end if end is not None else len(text)]
        if end is None:
            return call, None
        call.arguments = require_object(read_json(call.args))
        return call, self._closed_at(text, end)

    def _closed_at(self, text: str, end: int) -> int | None:
        if self.close is None:
            return end
        at = skip_space(text, end)
        if text.startswith(self.close, at):
            return at + len(self.close)
        if at == len(text) or could_become(text[at:], (self.close,)):
            return None
        raise Malformed(f"{self.close} expected")


@dataclass(kw_only=True)
class Mistral(ToolFormat):
    """``[TOOL_CALLS]NAME[ARGS]{…}`` (newer), or ``[TOOL_CALLS][{"name": …}]`` (Nemo)."""

    name: str = "mistral"

    def __post_init__(self) -> None:
        self.openers = ("[TOOL_CALLS]",)
        self._named = NamedJson(
            name="mistral", call_open="[TOOL_CALLS]", name_end="[ARGS]", clean=_mistral_name
        )
        self._objects = JsonObjects(name="mistral", opener="[TOOL_CALLS]", close=None)

    def scan(self, region: str, final: bool, tools: ToolSet) -> Scan:
        at = skip_space(region, len(self.openers[0]))
        if at == len(region):
            return Scan(failed="the call is empty" if final else None)
        if region[at] in "[{":
            return self._objects.scan(region, final, tools)
        return self._named.scan(region, final, tools)


def _mistral_name(text: str) -> str:
    return text.split("[CALL_ID]")[0].strip()


def kimi_name(text: str) -> str:
    """``functions.NAME:0`` -> ``NAME``."""
    match = re.fullmatch(r"\s*(?:functions\.)?(.+?)(?::\d+)?\s*", text)
    return match.group(1) if match else text.strip()
