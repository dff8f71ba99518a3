"""Single hostile requests must not freeze the server, orphan a generation or answer 500
(issue 39), through the session's real server and engine.

- An image spelled with JSON escapes (``"\\u0069mage_url"``, a MIME-less data URL) is decoded
  off the event loop like any other: ``/health`` keeps answering meanwhile; the RLE8 bomb of
  the issue so spelled is a 400 that names its compression.
- A malformed body (cut short, not UTF-8, nested 100,000 deep, NaN, a 5,000-digit number…)
  is a 400 in its route's dialect.
- A Responses hosted tool whose type holds non-Latin-1 text or CR/LF reaches the ``Warning``
  header only as plain ASCII, decided before anything was submitted; a streamed response
  dropped before it started cancels its engine requests.
"""

from __future__ import annotations

import gc
import io
import threading
import time
from typing import Any

import httpx
import pytest
from PIL import Image
from server_helpers import MODEL_ID, alice_headers, assert_still_serving

from benchmarks.hostile_inputs import (
    BAD_TOOL_TYPES,
    escaped_image_body,
    hosted_tool_body,
    malformed_bodies,
    rle8_bmp_with_noops,
)
from homelab.engine.api import GenerationRequest, SamplingParams
from homelab.engine.engine import Engine
from homelab.server.runner import ServerHandle
from homelab.server.streaming import EventStreamResponse

HEALTH_BUDGET_S = 0.1
IDLE_WITHIN_S = 2.0


def slow_jpeg() -> bytes:
    """A JPEG that takes a few hundred ms to decode (2048² progressive, of noise)."""
    buffer = io.BytesIO()
    Image.effect_noise((2048, 2048), 80).convert("RGB").save(buffer, "JPEG", progressive=True)
    return buffer.getvalue()


def health_latencies_s(server: ServerHandle, stop: threading.Event) -> list[float]:
    latencies: list[float] = []
    with httpx.Client(base_url=server.url, timeout=30) as http:
        while not stop.is_set():
            started = time.perf_counter()
            http.get("/health")
            latencies.append(time.perf_counter() - started)
            time.sleep(0.01)
    return latencies


def posted_while_probing_health(
    server: ServerHandle, path: str, raw: bytes, times: int
) -> tuple[list[httpx.Response], list[float]]:
    """``raw`` posted ``times`` times while another thread asks /health: the answers and
    /health's latencies meanwhile."""
    stop, latencies = threading.Event(), []
    prober = threading.Thread(target=lambda: latencies.extend(health_latencies_s(server, stop)))
    prober.start()
    answers = []
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            headers = {**alice_headers(), "Content-Type": "application/json"}
            answers = [http.post(path, content=raw, headers=headers) for _ in range(times)]
    finally:
        stop.set()
        prober.join()
    assert len(latencies) >= 5
    return answers, latencies


def test_an_escaped_image_is_decoded_off_the_event_loop(server: ServerHandle) -> None:
    raw = escaped_image_body(MODEL_ID, slow_jpeg())
    answers, latencies = posted_while_probing_health(server, "/v1/chat/completions", raw, 3)
    assert all(a.status_code in (200, 400) for a in answers), answers[0].text
    assert max(latencies) < HEALTH_BUDGET_S, f"/health took {max(latencies):.3f} s"


def test_an_escaped_rle_bomb_is_refused_off_the_event_loop(server: ServerHandle) -> None:
    """The issue's first example, whole: a 2x2 RLE8 BMP padded with millions of no-op
    commands, in a MIME-less data URL under an escaped type. Refused before Pillow walks it."""
    raw = escaped_image_body(MODEL_ID, rle8_bmp_with_noops())
    answers, latencies = posted_while_probing_health(server, "/v1/chat/completions", raw, 3)
    for answer in answers:
        assert answer.status_code == 400, answer.text
        assert "RLE8" in answer.json()["error"]["message"]
    assert max(latencies) < HEALTH_BUDGET_S, f"/health took {max(latencies):.3f} s"


@pytest.mark.parametrize(
    ("path", "raw"), malformed_bodies(MODEL_ID), ids=lambda v: v if isinstance(v, str) else ""
)
def test_a_malformed_body_is_a_400_in_its_dialect(
    server: ServerHandle, path: str, raw: bytes
) -> None:
    headers = {**alice_headers(), "Content-Type": "application/json"}
    response = httpx.post(server.url + path, content=raw, headers=headers, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()
    if path.startswith("/api/"):
        assert isinstance(error["error"], str) and error["error"]
    elif path.startswith("/v1/messages"):
        assert error["type"] == "error" and error["error"]["message"]
    else:
        assert error["error"]["message"] and error["error"]["type"] == "invalid_request_error"


def wait_idle(engine: Engine, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if engine.metrics().active_slots == 0 and engine.metrics().queue_depth == 0:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("tool_type", BAD_TOOL_TYPES)
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_hostile_hosted_tool_type_is_warned_as_plain_ascii(
    server: ServerHandle, engine: Engine, tool_type: str, stream: bool
) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for _ in range(4):
            body = hosted_tool_body(MODEL_ID, tool_type, stream)
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
