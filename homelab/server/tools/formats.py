"""What every tool-call format offers the stream: the markers that open a call region, and
a scanner that reads a region (complete or not) into calls.

A *region* is the text from an opening marker on: one call (``<tool_call>…</tool_call>``) or
a section holding several (``<|tool_calls_section_begin|>…``). :meth:`ToolFormat.scan` is
called again as the region grows; it returns the calls seen so far, each with the part of
its arguments that can no longer change (:attr:`PartialCall.args`, JSON text), and where the
region ended once it has. The stream turns the growth between two scans into deltas, so a
scanner's ``args`` must only ever grow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from homelab.server.tools.scan import Malformed, could_become, held_suffix, skip_space
from homelab.server.tools.toolset import ToolSet


@dataclass
class PartialCall:
    name: str
    args: str = ""  # the arguments' JSON text known so far (a prefix of the final text)
    arguments: dict[str, Any] | None = None  # set once the call is complete


@dataclass
class Scan:
    calls: list[PartialCall] = field(default_factory=list)
    end: int | None = None  # where the region ended (None: it goes on)
    failed: str | None = None  # why the region is not a call after all


class ToolFormat:
    """A model family's tool-call syntax (subclasses: one per family shape)."""

    name: str
    openers: tuple[str, ...] = ()  # markers that open a region anywhere in the content
    at_start: tuple[str, ...] = ()  # markers that open one only at the start of the reply

    def scan(self, region: str, final: bool, tools: ToolSet) -> Scan:
        raise NotImplementedError

    def markers(self) -> tuple[str, ...]:
        return self.openers + self.at_start


@dataclass(kw_only=True)
class Composite(ToolFormat):
    """Several syntaxes one model may write (Hermes blocks or bare Llama 3 JSON)."""

    parts: tuple[ToolFormat, ...]
    name: str = "generic"

    def __post_init__(self) -> None:
        self.openers = tuple(m for p in self.parts for m in p.openers)
        self.at_start = tuple(m for p in self.parts for m in p.at_start)

    def scan(self, region: str, final: bool, tools: ToolSet) -> Scan:
        for part in self.parts:
            if any(region.startswith(m) for m in part.markers()):
                return part.scan(region, final, tools)
        return Scan(failed="no known marker")


MAX_NAME = 256


def scan_calls(
    region: str,
    start: int,
    final: bool,
    call_open: str,
    section_close: str | None,
    read_call: Callable[[str, int], tuple[PartialCall | None, int | None]],
    *,
    sectioned: bool,
) -> Scan:
    """Calls that each start with ``call_open``: one (the region is the call) or, in a
    section, several until ``section_close`` (or, with no close marker, until other text)."""
    calls: list[PartialCall] = []
    pos = start
    while True:
        at = skip_space(region, pos)
        if sectioned and section_close and region.startswith(section_close, at):
            return Scan(calls, end=at + len(section_close))
        if region.startswith(call_open, at):
            call, end = read_call(region, at + len(call_open))
            calls += [call] if call else []
            if end is None:
                return Scan(calls, failed="the call is not closed" if final else None)
            if not sectioned:
                return Scan(calls, end=end)
            pos = end
            continue
        ends = [call_open, section_close or ""]
        if at == len(region) or could_become(region[at:], ends):
            if sectioned and section_close is None and calls and final:
                return Scan(calls, end=pos)
            return Scan(calls, failed="the calls are not closed" if final else None)
        if sectioned and section_close is None and calls:
            return Scan(calls, end=pos)
        return Scan(calls, failed=f"unexpected text in a call: {region[at : at + 30]!r}")


class MarkedCalls(ToolFormat):
    """Calls that each open with ``call_open``, alone or inside a ``section`` (its opening
    marker and its close, None when other text ends it); a subclass reads one call
    (:meth:`read_call`: the call from just after ``call_open``, and where it ended)."""

    call_open: str
    section: tuple[str, str | None] | None

    def __post_init__(self) -> None:
        self.openers = (self.section[0] if self.section else self.call_open,)

    def scan(self, region: str, final: bool, tools: ToolSet) -> Scan:
        def read(text: str, pos: int) -> tuple[PartialCall | None, int | None]:
            return self.read_call(text, pos, tools)

        if self.section is None:
            return scan_calls(region, 0, final, self.call_open, None, read, sectioned=False)
        opener, close = self.section
        return scan_calls(region, len(opener), final, self.call_open, close, read, sectioned=True)

    def read_call(
        self, text: str, pos: int, tools: ToolSet
    ) -> tuple[PartialCall | None, int | None]:
        raise NotImplementedError


def require_name(name: str, tools: ToolSet) -> str:
    """A called tool's name, if it was offered (a call to anything else is not a call)."""
    if not tools.offers(name):
        raise Malformed(f"{name[:60]!r} is not an offered tool")
    return name


def require_object(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Malformed("the arguments are not a JSON object")
    return value


def name_until(text: str, pos: int, ends: tuple[str, ...]) -> tuple[str, int, str] | None:
    """The text from ``pos`` to the first of ``ends`` (and which one), or None while none has
    arrived; a name longer than any real one is refused."""
    found = [(i, e) for e in ends if (i := text.find(e, pos)) >= 0]
    # the name's length so far (not counting what may be the start of its end), so that a
    # text is refused the same whether it arrived whole or a character at a time
    at, end = min(found) if found else (len(text) - held_suffix(text[pos:], ends), "")
    if at - pos > MAX_NAME:
        raise Malformed("a tool name runs on")
    return (text[pos:at], at, end) if found else None
