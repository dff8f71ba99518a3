"""Server-sent events: the one framing (:func:`sse_event`), and a response that stops
generating when the client leaves.

:class:`EventStreamResponse` sends the events of an async iterator while watching for the
client's disconnect; on disconnect it cancels the iteration, and the iterator's ``finally``
(which cancels the engine requests) always runs, so a gone client frees its slot at once
instead of at the next token. An error after the stream started is sent as an event
carrying the error envelope, followed by ``data: [DONE]``. Events that are ready together
(the engine wakes a stream's reader about once a millisecond on the shortest steps) go out in
one write.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from homelab.server.engine_seam import HandleLike
from homelab.server.errors import ApiError

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MIN_RECEIVE_PAUSE_S = 0.01  # see wait_for_disconnect
MAX_RECEIVE_PAUSE_S = 0.5


# compact JSON, UTF-8 as it is; one encoder for every event (``json.dumps`` with options
# builds a new one per call: ~0.7 µs of the event loop's time per streamed token)
_COMPACT_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
# one string as that encoder writes it (ensure_ascii=False: UTF-8 kept, quotes and controls escaped)
_json_string: Callable[[str], str] = json.encoder.encode_basestring


def sse_event(payload: Mapping[str, Any], name: str | None = None) -> bytes:
    """One server-sent event: ``data:`` with the compact JSON of ``payload``, after an
    ``event: name`` line when the dialect names its events (Anthropic, Responses)."""
    data = b"data: " + _COMPACT_JSON.encode(payload).encode()
    if name is None:
        return data + b"\n\n"
    return b"event: " + name.encode() + b"\n" + data + b"\n\n"


# strings no payload holds: where a token's text (and a running number) go in a payload
# encoded once and split there (text_events, numbered_text_events)
_TEXT_MARK = "\ue000homelab text\ue000"
_NUMBER_MARK = "\ue000homelab number\ue000"


def text_events(
    payload_with: Callable[[str], Mapping[str, Any]], name: str | None = None
) -> Callable[[str], bytes]:
    """``sse_event(payload_with(text), name)`` for the chunks of a stream that differ only in
    one string (a token's text): the payload is encoded once with a mark in its place and
    split there, and each event is the two halves around the text's JSON string — the same
    bytes, without building and walking the payload for every token (a dozen calls fewer on
    the event loop, per token). Falls back to encoding the payload when the mark is not
    found exactly once."""
    pieces = _split_at(sse_event(payload_with(_TEXT_MARK), name), (_TEXT_MARK,))
    if pieces is None:
        return lambda text: sse_event(payload_with(text), name)
    head, tail = pieces

    def event(text: str) -> bytes:
        return head + _json_string(text).encode() + tail

    return event


def numbered_text_events(
    payload_with: Callable[[Any, str], Mapping[str, Any]], name: str | None = None
) -> Callable[[int, str], bytes]:
    """:func:`text_events` for chunks that also carry a running number before their text
    (the Responses API's ``sequence_number``): ``event(number, text)`` is
    ``sse_event(payload_with(number, text), name)``, made from three pieces split once."""
    marked = sse_event(payload_with(_NUMBER_MARK, _TEXT_MARK), name)
    pieces = _split_at(marked, (_NUMBER_MARK, _TEXT_MARK))
    if pieces is None:
        return lambda number, text: sse_event(payload_with(number, text), name)
    head, middle, tail = pieces

    def event(number: int, text: str) -> bytes:
        return head + str(number).encode() + middle + _json_string(text).encode() + tail

    return event


def _split_at(encoded: bytes, marks: tuple[str, ...]) -> list[bytes] | None:
    """``encoded`` cut where each mark's JSON string stands, in that order; None unless each
    stands there exactly once, in that order."""
    cuts = [_json_string(mark).encode() for mark in marks]
    if any(encoded.count(cut) != 1 for cut in cuts):
        return None
    pieces, rest = [], encoded
    for cut in cuts:
        before, found, rest = rest.partition(cut)
        if not found:  # out of order: it stood in an earlier piece
            return None
        pieces.append(before)
    return [*pieces, rest]


def sse_error(error: ApiError) -> bytes:
    return sse_event(error.envelope())


async def wait_for_disconnect(receive: Receive) -> None:
    """Return once the client has gone; sleeps (no CPU) until then.

    Called after the request body has been read in full. From then on an ASGI server's
    ``receive()`` blocks until the client disconnects (uvicorn does). A server or middleware
    that instead answers at once (an empty ``http.request`` again and again) would turn a
    plain ``while`` loop into one that burns a core for as long as the generation runs,
    stealing it from llama.cpp: such answers are spaced out (10 ms doubling to 0.5 s), so a
    disconnect is still seen within half a second and the loop stays idle.
    """
    pause_s = 0.0
    while (await receive())["type"] != "http.disconnect":
        pause_s = min(max(2 * pause_s, MIN_RECEIVE_PAUSE_S), MAX_RECEIVE_PAUSE_S)
        await anyio.sleep(pause_s)


async def run_while_connected(receive: Receive, work: Coroutine[Any, Any, None]) -> bool:
    """Run ``work`` while watching for the client's disconnect: True when it ran to its end,
    False when the client left first (``work`` is then cancelled, and its ``finally`` blocks
    have run when this returns). An exception of ``work`` propagates as itself.

    Plain asyncio tasks, not an anyio task group: cancelling an anyio scope formats the
    task's repr, a few hundred µs of the event loop's time on every request."""
    worker = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    stopped = False
    try:
        await asyncio.wait((worker, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not worker.done():  # the client left, or this request itself is being cancelled
            worker.cancel()
            stopped = True
            await asyncio.wait((worker,))
    if stopped:
        if not worker.cancelled():
            worker.exception()  # what it raised while stopping is not the request's error
        return False
    worker.result()  # raises what ``work`` raised
    return True


class EventStreamResponse(Response):
    """Sends the chunks of ``events``; while ``more_ready()`` says the next one comes without
    a wait (the request's next engine event is already queued), a chunk is held and goes out
    with the next in one write: a ``send`` each (a syscall, and a wake of the client on
    loopback) was a third of the event loop's work per streamed token. A chunk so held waits
    at most for the request's next engine event (one step)."""

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncIterator[bytes],
        more_ready: Callable[[], bool] | None = None,
        *,
        handles: Sequence[HandleLike] = (),
    ) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(SSE_HEADERS)  # no body: no Content-Length, the stream decides its end
        self._events = events
        self._more_ready = more_ready or _never
        # the engine requests ``events`` reads: cancelled when the stream is over, and when
        # this response is dropped unsent (an error between submission and the first byte):
        # an iterator that never started runs no ``finally`` of its own
        self._over = weakref.finalize(self, _cancel_all, tuple(handles))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
            await send(start)
            await run_while_connected(receive, self._send_events(send))
        finally:
            await self._close_events()
            self._over()  # finished requests ignore it

    async def _send_events(self, send: Send) -> None:
        more_ready, held = self._more_ready, b""
        try:
            async for chunk in self._events:
                if more_ready():
                    held += chunk
                    continue
                if held:
                    chunk, held = held + chunk, b""
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": held, "more_body": False})
        except OSError:  # the client went away while we were sending
            return

    async def _close_events(self) -> None:
        aclose = getattr(self._events, "aclose", None)
        if aclose is not None:
            with anyio.CancelScope(shield=True):
                await aclose()


def _never() -> bool:
    return False


def _cancel_all(handles: Sequence[HandleLike]) -> None:
    for handle in handles:
        handle.cancel()


def next_event_ready(handles: Sequence[HandleLike]) -> Callable[[], bool] | None:
    """``EventStreamResponse``'s ``more_ready`` for a stream of these engine requests: the
    one request's ``has_queued``; None (each chunk sent as it comes) for several, whose
    events come through tasks of their own."""
    return handles[0].has_queued if len(handles) == 1 else None
