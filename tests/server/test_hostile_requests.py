"""Single hostile requests must not freeze the server, orphan a generation or answer 500
(issue 39), through the session's real server and engine.

- An image spelled with JSON escapes (``"\\u0069mage_url"``, a MIME-less data URL) is decoded
  off the event loop like any other: ``/health`` keeps answering meanwhile.
- A Responses hosted tool whose type holds non-Latin-1 text or CR/LF reaches the ``Warning``
  header only as plain ASCII, decided before anything was submitted; a streamed response
  dropped before it started cancels its engine requests.
"""

from __future__ import annotations

import base64
import gc
import io
import json
import threading
import time
from typing import Any

import httpx
import pytest
from PIL import Image
from server_helpers import MODEL_ID, alice_headers, assert_still_serving

from homelab.engine.api import GenerationRequest, SamplingParams
from homelab.engine.engine import Engine
from homelab.server.runner import ServerHandle
from homelab.server.streaming import EventStreamResponse

HEALTH_BUDGET_S = 0.1
IDLE_WITHIN_S = 2.0


def slow_image_body() -> bytes:
    """A chat request whose image takes a few hundred ms to decode (a 2048² progressive JPEG
    of noise), its type and URL spelled so that the raw body never holds the bytes 'image'."""
    buffer = io.BytesIO()
    Image.effect_noise((2048, 2048), 80).convert("RGB").save(buffer, "JPEG", progressive=True)
    url = "data:;base64," + base64.b64encode(buffer.getvalue()).decode()
    part = {"type": "image_url", "image_url": {"url": url}}
    body = {"model": MODEL_ID, "max_tokens": 1, "messages": [{"role": "user", "content": [part]}]}
    raw = json.dumps(body).replace("image_url", "\\u0069mage_url").encode()
    assert b"image" not in raw
    return raw


def health_latencies_s(server: ServerHandle, stop: threading.Event) -> list[float]:
    latencies: list[float] = []
    with httpx.Client(base_url=server.url, timeout=30) as http:
        while not stop.is_set():
            started = time.perf_counter()
            http.get("/health")
            latencies.append(time.perf_counter() - started)
            time.sleep(0.01)
    return latencies


def test_an_escaped_image_is_decoded_off_the_event_loop(server: ServerHandle) -> None:
    raw = slow_image_body()
    stop, latencies = threading.Event(), []
    prober = threading.Thread(target=lambda: latencies.extend(health_latencies_s(server, stop)))
    prober.start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            headers = {**alice_headers(), "Content-Type": "application/json"}
            for _ in range(3):
                response = http.post("/v1/chat/completions", content=raw, headers=headers)
                assert response.status_code in (200, 400), response.text
    finally:
        stop.set()
        prober.join()
    assert len(latencies) >= 5
    assert max(latencies) < HEALTH_BUDGET_S, f"/health took {max(latencies):.3f} s"


def hosted_tool_body(tool_type: str, stream: bool) -> dict[str, Any]:
    return {
        "model": MODEL_ID,
        "input": "tell me a long story",
        "max_output_tokens": 300,
        "stream": stream,
        "tools": [{"type": tool_type}, {"type": "function", "name": "f", "parameters": {}}],
    }


def wait_idle(engine: Engine, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if engine.metrics().active_slots == 0 and engine.metrics().queue_depth == 0:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("tool_type", ["web_search_é€", "web\r\nX-Evil: 1", "ok\x00"])
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_hostile_hosted_tool_type_is_warned_as_plain_ascii(
    server: ServerHandle, engine: Engine, tool_type: str, stream: bool
) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for _ in range(4):
            body = hosted_tool_body(tool_type, stream)
            response = http.post("/v1/responses", json=body, headers=alice_headers())
            assert response.status_code == 200, response.text
            warning = response.headers["Warning"]
            assert warning.isascii() and "\r" not in warning and "\n" not in warning
            assert "X-Evil" not in response.headers
            assert "were ignored" in warning
        assert wait_idle(engine, IDLE_WITHIN_S), "a slot stayed busy"
        started = time.monotonic()
        assert_still_serving(http)
        assert time.monotonic() - started < 10


def test_a_stream_dropped_before_it_started_cancels_its_requests(engine: Engine) -> None:
    request = GenerationRequest(
        tenant="alice", prompt=[1, 2, 3], sampling=SamplingParams(max_tokens=400)
    )
    handle = engine.submit(request)

    async def never_read() -> Any:
        yield b""

    EventStreamResponse(never_read(), handles=[handle])  # made, then dropped unsent
    gc.collect()
    assert handle.cancelled
    assert wait_idle(engine, IDLE_WITHIN_S)
