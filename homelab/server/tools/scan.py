"""Small scanners the format parsers share: where a JSON value ends in text that is still
arriving, whether some text could still become a marker, JSON string literals.

Everything here works on a prefix of the model's output: "incomplete" (None) is a normal
answer, and invalid text raises :class:`Malformed` so the parser can hand it back as content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from homelab.server.tools.strict_json import MAX_DEPTH, Malformed, strict_json_loads

_STRUCTURE = re.compile(r'["{}\[\]]')
_IN_STRING = re.compile(r'["\\]')
_BARE = re.compile(r"(?:[\s,:0-9eE.+\-]|true|false|null)*")
_BARE_TAIL = re.compile(r"t(?:r(?:ue?)?)?|f(?:a(?:l(?:se?)?)?)?|n(?:u(?:ll?)?)?")
_CLOSERS = {"}": "{", "]": "["}
_WHITESPACE = re.compile(r"\s*")


def skip_space(text: str, pos: int) -> int:
    match = _WHITESPACE.match(text, pos)
    return match.end() if match else pos


def could_become(text: str, markers: Iterable[str]) -> bool:
    """Whether ``text`` is a proper prefix of one of ``markers`` (more text may finish it)."""
    return any(len(text) < len(m) and m.startswith(text) for m in markers)


def held_suffix(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a marker."""
    longest = 0
    for marker in markers:
        for length in range(min(len(text), len(marker) - 1), longest, -1):
            if marker.startswith(text[-length:]):
                longest = length
                break
    return longest


def _check_bare(segment: str, last: bool) -> None:
    """Text between JSON strings and brackets: numbers, literals, commas, colons."""
    match = _BARE.match(segment)
    rest = segment[match.end() if match else 0 :]
    if rest and not (last and _BARE_TAIL.fullmatch(rest)):
        raise Malformed(f"not JSON: {segment[:40]!r}")


def _string_end(text: str, pos: int) -> int | None:
    """Index after the closing quote of the string whose opening quote is at ``pos - 1``."""
    while (match := _IN_STRING.search(text, pos)) is not None:
        if match.group() == '"':
            return match.end()
        pos = match.end() + 1
        if pos > len(text):
            return None
    return None


def container_end(text: str, pos: int) -> int | None:
    """Index after the JSON object or array that starts at ``text[pos]`` (``{`` or ``[``);
    None while it is incomplete. Raises Malformed on broken structure or too deep nesting."""
    stack: list[str] = []
    at = pos
    while (match := _STRUCTURE.search(text, at)) is not None:
        _check_bare(text[at : match.start()], last=False)
        char, at = match.group(), match.end()
        if char == '"':
            end = _string_end(text, at)
            if end is None:
                return None
            at = end
        elif char in "{[":
            stack.append(char)
            if len(stack) > MAX_DEPTH:
                raise Malformed("arguments nested too deeply")
        elif not stack or stack.pop() != _CLOSERS[char]:
            raise Malformed("unbalanced brackets")
        if not stack:
            return at
    _check_bare(text[at:], last=True)
    return None


def value_end(text: str, pos: int) -> int | None:
    """Index after the JSON value at ``text[pos]`` (any kind); None while incomplete.

    A bare number or literal is complete only once something follows it."""
    if pos >= len(text):
        return None
    if text[pos] in "{[":
        return container_end(text, pos)
    if text[pos] == '"':
        return _string_end(text, pos + 1)
    match = re.compile(r"[^\s,}\]]*").match(text, pos)
    end = match.end() if match else pos
    if end == len(text):
        return None
    if end == pos:
        raise Malformed("a JSON value is missing")
    read_json(text[pos:end])
    return end


def read_json(text: str) -> object:
    """``text`` as strict JSON: ``NaN``, ``Infinity`` and numbers too large for a double
    (``1e999``) are refused, as no client's JSON parser reads them."""
    try:
        return strict_json_loads(text)
    except (ValueError, RecursionError) as exc:
        raise Malformed(str(exc)) from exc


def string_prefix(text: str) -> str:
    """``text`` as the start of a JSON string literal (opening quote, no closing one)."""
    return json.dumps(text, ensure_ascii=False)[:-1]


__all__ = ["MAX_DEPTH", "Malformed"]
