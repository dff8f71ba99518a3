"""The event loop sleeps while requests generate: no core burnt waiting for a disconnect.

A non-streaming request has nothing to send until its last token, so the only thing the
loop does meanwhile is wait for the client to leave (to cancel the generation). Done by
polling, or by re-awaiting a ``receive()`` that answers at once, that wait burns a whole
core for as long as the generation runs — on a 2-core machine, half of what llama.cpp had.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import anyio
import httpx
import pytest
from server_helpers import MODEL_ID, N_CTX_PER_SLOT, N_SLOTS, alice_headers

from homelab.server.runner import ServerHandle
from homelab.server.streaming import wait_for_disconnect

NO_END = {"2": -100, "4": -100}  # ban </s> and <|im_end|>: every answer runs to max_tokens
LOOP_SHARE_LIMIT = 0.25  # of one core; measured ~0.03 here, a busy wait takes ~1.0
# Requests per client, one after another: ~3 s of generation, so that one scheduler hiccup
# or garbage collection cannot pass for a busy loop (a 0.75 s window once read 29 % in CI).
ROUNDS = 4


def thread_cpu_s(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def long_completions(server: ServerHandle, index: int, stream: bool) -> int:
    return sum(long_completion(server, index * ROUNDS + n, stream) for n in range(ROUNDS))


def long_completion(server: ServerHandle, index: int, stream: bool) -> int:
    body = {
        "model": MODEL_ID,
        "prompt": f"request {index}: the cache",
        "max_tokens": N_CTX_PER_SLOT - 32,
        "logit_bias": NO_END,
        "stream": stream,
    }
    with httpx.Client(base_url=server.url, timeout=120) as http:
        if not stream:
            response = http.post("/v1/completions", json=body, headers=alice_headers())
            assert response.status_code == 200, response.text
            return int(response.json()["usage"]["completion_tokens"])
        with http.stream("POST", "/v1/completions", json=body, headers=alice_headers()) as events:
            return sum(1 for line in events.iter_lines() if line.startswith('data: {"id"'))


def loop_share_during(server: ServerHandle, stream: bool) -> tuple[float, int]:
    """(loop CPU seconds / wall seconds, tokens) while every slot runs ROUNDS long requests."""
    results: list[int] = []
    clients = [
        threading.Thread(target=lambda i=i: results.append(long_completions(server, i, stream)))
        for i in range(N_SLOTS)
    ]
    gc.collect()
    gc.freeze()  # a session's worth of live objects is not rescanned inside the window
    try:
        cpu_before, started = thread_cpu_s(server.thread), time.perf_counter()
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        share = (thread_cpu_s(server.thread) - cpu_before) / (time.perf_counter() - started)
    finally:
        gc.unfreeze()
    return share, sum(results)


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
def test_the_loop_sleeps_while_requests_generate(server: ServerHandle, stream: bool) -> None:
    share, tokens = loop_share_during(server, stream)
    assert tokens >= ROUNDS * N_SLOTS * (N_CTX_PER_SLOT - 64)  # the requests really ran long
    print(f"event loop: {share:.1%} of a core over {tokens} tokens")
    assert share < LOOP_SHARE_LIMIT, f"the event loop used {share:.0%} of a core"


async def test_a_receive_that_never_blocks_is_not_spun_on() -> None:
    """A server (or middleware) whose ``receive()`` answers at once after the body would make
    a plain loop spin; the wait spaces such answers out and still sees the disconnect."""
    calls = 0

    async def eager_receive() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        return {"type": "http.disconnect"} if calls > 5 else {"type": "http.request", "body": b""}

    started = time.perf_counter()
    with anyio.fail_after(5):
        await wait_for_disconnect(eager_receive)
    assert calls == 6
    assert time.perf_counter() - started >= 0.3  # 10+20+40+80+160 ms between eager answers
