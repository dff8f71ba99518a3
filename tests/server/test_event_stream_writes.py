"""``EventStreamResponse`` sends the chunks that are ready together in one write, and never
holds a chunk while the stream waits: the ASGI messages it sends, for scripted streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from homelab.server.streaming import EventStreamResponse, next_event_ready


class Stream:
    """Chunks to yield, each with whether the next one is already there (``ready``), and
    a log of what the stream did: ``("yield", chunk)`` and ``("wait", n)`` when it waits."""

    def __init__(self, chunks: list[tuple[bytes, bool]]) -> None:
        self.chunks = chunks
        self.next_ready = False
        self.log: list[tuple[str, Any]] = []

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for index, (chunk, ready_after) in enumerate(self.chunks):
            if not self.next_ready:
                self.log.append(("wait", index))
                await asyncio.sleep(0)  # a wait for the engine's next event
            self.next_ready = ready_after
            self.log.append(("yield", chunk))
            yield chunk

    def more_ready(self) -> bool:
        return self.next_ready


async def bodies_sent(
    stream: Stream, more_ready: Callable[[], bool] | None
) -> tuple[list[bytes], list[tuple[str, Any]]]:
    """The bodies of the ``http.response.body`` messages, and the stream's log with each
    send in its place (``("send", body)``)."""
    sent: list[dict[str, Any]] = []
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            stream.log.append(("send", message["body"]))

    response = EventStreamResponse(stream.__aiter__(), more_ready)
    await response(scope={"type": "http"}, receive=receive, send=send)
    assert sent[0]["type"] == "http.response.start"
    assert [m["more_body"] for m in sent[1:]] == [True] * (len(sent) - 2) + [False]
    return [m["body"] for m in sent[1:]], stream.log


async def test_chunks_ready_together_go_out_in_one_write() -> None:
    stream = Stream([(b"a", True), (b"b", True), (b"c", False), (b"d", False), (b"e", False)])
    bodies, _ = await bodies_sent(stream, stream.more_ready)
    assert bodies == [b"abc", b"d", b"e", b""]


async def test_no_chunk_is_held_while_the_stream_waits() -> None:
    stream = Stream([(b"a", True), (b"b", False), (b"c", True), (b"d", False), (b"e", False)])
    _, log = await bodies_sent(stream, stream.more_ready)
    held: list[bytes] = []
    for what, value in log:
        if what == "yield":
            held.append(value)
        elif what == "send":
            sent = b"".join(held)
            assert value == sent or (value == b"" and not held)
            held.clear()
        else:  # a wait: everything yielded so far has been sent
            assert not held, (value, held)
    assert not held


async def test_a_chunk_held_at_the_end_goes_out_with_the_last_message() -> None:
    stream = Stream([(b"a", False), (b"b", True)])  # the stream ends while "ready" said more
    bodies, _ = await bodies_sent(stream, stream.more_ready)
    assert bodies == [b"a", b"b"]


async def test_without_a_readiness_test_every_chunk_is_its_own_write() -> None:
    stream = Stream([(b"a", True), (b"b", True), (b"c", False)])
    bodies, _ = await bodies_sent(stream, None)
    assert bodies == [b"a", b"b", b"c", b""]


class Handle:
    def __init__(self, queued: bool) -> None:
        self.queued = queued

    def has_queued(self) -> bool:
        return self.queued


def test_only_a_stream_of_one_request_merges() -> None:
    one = Handle(True)
    ready = next_event_ready([one])
    assert ready is not None and ready() is True
    one.queued = False
    assert ready() is False
    # several choices (n > 1) come through tasks of their own: what one has queued says
    # nothing about when the stream's next chunk comes
    assert next_event_ready([Handle(True), Handle(True)]) is None
