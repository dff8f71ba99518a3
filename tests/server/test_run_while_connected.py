"""``run_while_connected``: the race between a request's work and its client's disconnect that
every non-streamed response and every event stream runs (plain asyncio tasks)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from homelab.server.streaming import run_while_connected


class Client:
    """An ASGI ``receive`` that blocks until :meth:`leave` (as uvicorn's does after the body)."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    def leave(self) -> None:
        self.gone.set()


async def test_work_that_ends_returns_true() -> None:
    done: list[str] = []

    async def work() -> None:
        await asyncio.sleep(0.01)
        done.append("work")

    assert await run_while_connected(Client().receive, work()) is True
    assert done == ["work"]


async def test_a_client_leaving_first_cancels_the_work_and_its_finally_has_run() -> None:
    client, events = Client(), []

    async def work() -> None:
        try:
            client.leave()
            await asyncio.sleep(60)
            events.append("finished")
        finally:
            events.append("cleaned up")

    assert await asyncio.wait_for(run_while_connected(client.receive, work()), 5) is False
    assert events == ["cleaned up"]


async def test_an_error_of_the_work_propagates_as_itself() -> None:
    async def work() -> None:
        raise ValueError("bad request")

    with pytest.raises(ValueError, match="bad request"):  # not wrapped in an exception group
        await run_while_connected(Client().receive, work())


async def test_cancelling_the_request_cancels_its_work() -> None:
    started, events = asyncio.Event(), []

    async def work() -> None:
        try:
            started.set()
            await asyncio.sleep(60)
        finally:
            events.append("cleaned up")

    request = asyncio.ensure_future(run_while_connected(Client().receive, work()))
    await started.wait()
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert events == ["cleaned up"]
