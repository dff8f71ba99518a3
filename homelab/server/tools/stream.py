"""Tool calls found in text as it arrives, in any registered format.

:class:`ToolCallStream` is fed the answer text token by token. Outside a call it releases
everything except a suffix that could still become the format's opening marker (the longest
marker prefix, no more). From an opening marker on it holds a *region* and asks the format
to scan it each time it grows: a call whose name is known becomes a
:class:`~homelab.server.pieces.ToolCallStart`, the growth of its arguments
:class:`~homelab.server.pieces.ToolCallArgs` fragments, and the end of the region one whole
:class:`~homelab.server.pieces.ToolCall` per call. A region that turns out not to be a call
(bad JSON, a tool that was not offered, text the format does not allow) is handed back as
content, so nothing the model did not write becomes a call.

Re-scanning a region costs its length; a region over 512 characters is re-scanned only once
it has grown by a sixteenth, which keeps hostile output (10,000 nested brackets) cheap.
"""

from __future__ import annotations

import json
import logging
import secrets

from homelab.server.pieces import ContentDelta, StreamPiece, ToolCall, ToolCallArgs, ToolCallStart
from homelab.server.tools.detect import GENERIC
from homelab.server.tools.formats import PartialCall, Scan, ToolFormat
from homelab.server.tools.scan import could_become, held_suffix
from homelab.server.tools.strict_json import strict_json_loads
from homelab.server.tools.toolset import ToolSet

log = logging.getLogger(__name__)

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
Piece = StreamPiece


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


class ToolCallStream:
    def __init__(self, tool_format: ToolFormat | None = None, tools: ToolSet | None = None):
        self._format = tool_format or GENERIC
        self._tools = tools or ToolSet()
        self._buffer = ""
        self._in_region = False
        self._at_start = bool(self._format.at_start)  # nothing but whitespace released yet
        self._index = 0  # calls finished in earlier regions
        self._sent: list[tuple[str, str]] = []  # (id, arguments text sent) per started call
        self._scanned = 0

    def feed(self, text: str) -> list[StreamPiece]:
        self._buffer += text
        return self._drain(final=False)

    def finish(self) -> list[StreamPiece]:
        pieces = self._drain(final=True)
        if self._buffer:  # an unfinished region the format could not close
            pieces.append(ContentDelta(self._buffer))
            self._buffer = ""
        return pieces

    def _drain(self, final: bool) -> list[StreamPiece]:
        pieces: list[StreamPiece] = []
        while True:
            step = self._region_step(final) if self._in_region else self._content_step(final)
            if step is None:
                return [p for p in pieces if not (isinstance(p, ContentDelta) and not p.text)]
            pieces += step

    # --- outside calls -----------------------------------------------------------------------

    def _content_step(self, final: bool) -> list[StreamPiece] | None:
        if not self._buffer:
            return None
        if self._at_start:
            return self._start_step(final)
        found = [(at, m) for m in self._format.openers if (at := self._buffer.find(m)) >= 0]
        if found:
            at = min(found)[0]
            return self._enter(at)
        keep = 0 if final else held_suffix(self._buffer, self._format.openers)
        cut = len(self._buffer) - keep
        released, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return [ContentDelta(released)] if released else None

    def _start_step(self, final: bool) -> list[StreamPiece] | None:
        """The reply's first text: it may open a call only allowed there (Llama 3 JSON)."""
        head = self._buffer.lstrip()
        if any(head.startswith(m) for m in self._format.at_start):
            self._buffer = head
            return self._enter(0)
        if not final and (not head or could_become(head, self._format.at_start)):
            return None
        self._at_start = False
        return []

    def _enter(self, at: int) -> list[StreamPiece]:
        before, self._buffer = self._buffer[:at], self._buffer[at:]
        self._in_region, self._at_start, self._scanned, self._sent = True, False, 0, []
        return [ContentDelta(before)]

    # --- inside a region -----------------------------------------------------------------------

    def _region_step(self, final: bool) -> list[StreamPiece] | None:
        grown = len(self._buffer) - self._scanned
        if not final and grown < max(1, (self._scanned - 512) // 16):
            return None
        self._scanned = len(self._buffer)
        scan = self._scan(final)
        if scan.failed:
            return self._give_up(scan)
        pieces = self._deltas(scan.calls)
        if scan.end is None:
            if final:  # the format neither closed nor refused: not a call
                return [*pieces, *self._give_up(Scan(scan.calls, failed="not closed"))]
            return pieces or None
        return [*pieces, *self._close(scan.calls, scan.end)]

    def _scan(self, final: bool) -> Scan:
        try:
            return self._format.scan(self._buffer, final, self._tools)
        except (ValueError, RecursionError) as exc:  # Malformed, or a scanner's own slip
            return Scan(failed=str(exc) or type(exc).__name__)

    def _deltas(self, calls: list[PartialCall]) -> list[StreamPiece]:
        pieces: list[StreamPiece] = []
        for number, call in enumerate(calls):
            if not call.name:
                break
            if number == len(self._sent):
                self._sent.append((new_call_id(), ""))
                pieces.append(ToolCallStart(self._index + number, self._sent[-1][0], call.name))
            call_id, sent = self._sent[number]
            if len(call.args) > len(sent) and call.args.startswith(sent):
                pieces.append(ToolCallArgs(self._index + number, call.args[len(sent) :]))
                self._sent[number] = (call_id, call.args)
        return pieces

    def _close(self, calls: list[PartialCall], end: int) -> list[StreamPiece]:
        done = [c for c in calls if c.arguments is not None and c.name]
        pieces = self._deltas(done)
        finished = [self._finished(number, call) for number, call in enumerate(done)]
        if any(call is None for call in finished):  # never a call unlike what was streamed
            return [*pieces, *self._give_up(Scan(failed="the streamed arguments differ"))]
        pieces += [call for call in finished if call is not None]
        self._index += len(done)
        self._buffer, self._in_region, self._sent = self._buffer[end:], False, []
        return pieces

    def _finished(self, number: int, call: PartialCall) -> ToolCall | None:
        """The whole call, if the arguments streamed for it are strict JSON spelling the
        same object (a client assembles the fragments); None if they are not."""
        call_id, sent = self._sent[number]
        try:
            arguments = json.dumps(call.arguments, ensure_ascii=False, allow_nan=False)
            streamed = strict_json_loads(sent) if sent else call.arguments
        except (ValueError, TypeError, RecursionError):
            return None
        return ToolCall(call_id, call.name, arguments) if streamed == call.arguments else None

    def _give_up(self, scan: Scan) -> list[StreamPiece]:
        """The region is not a call after all: its marker goes back to the content and the
        text after it is read again, so a later marker is still found (as in a whole reply)."""
        log.debug("not a tool call (%s): %.80r", scan.failed, self._buffer)
        self._in_region = False
        if self._sent:  # the stream already showed a call start: the client sees it unfinished
            log.warning("a tool call the model began is malformed (%s)", scan.failed)
            self._index += len(self._sent)  # its index is spent: the next call gets a new one
            self._sent = []
        marker = next((m for m in self._format.markers() if self._buffer.startswith(m)), "")
        cut = max(1, len(marker))
        text, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return [ContentDelta(text)]


def split_tool_calls(
    text: str, tool_format: ToolFormat | None = None, tools: ToolSet | None = None
) -> tuple[str, list[ToolCall]]:
    """A finished message as (content, calls), the same way the stream splits it."""
    stream = ToolCallStream(tool_format, tools)
    pieces = stream.feed(text) + stream.finish()
    content = "".join(p.text for p in pieces if isinstance(p, ContentDelta))
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    return (content.strip() if calls else content), calls
