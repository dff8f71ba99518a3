"""Unbounded work before a 400 (issue 39): a forced ``tool_choice`` over a huge schema, an
image URL served one byte at a time or with broken HTTP, a ``keep_alive`` of 400 digits.
Each is a prompt 400 that says what was wrong, and the server keeps answering meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from server_helpers import MODEL_ID, alice_headers, assert_still_serving, make_keys
from test_hostile_requests import HEALTH_BUDGET_S, posted_while_probing_health
from test_image_requests import PNG, _chat_with, chat_body

from benchmarks.hostile_inputs import many_properties_body, many_turns_body
from homelab.engine.engine import Engine
from homelab.errors import ConfigError, EngineError
from homelab.server import anthropic
from homelab.server.config import ServerConfig
from homelab.server.fleet import MAX_KEEP_ALIVE_S, parse_keep_alive
from homelab.server.image_parts import ImagePolicy
from homelab.server.runner import ServerHandle, start_server
from homelab.server.tools import FORMATS, forced_call_grammar

# --- forced tool_choice -------------------------------------------------------------------------


def test_a_forced_call_over_a_huge_schema_is_a_quick_400(server: ServerHandle) -> None:
    raw = many_properties_body(MODEL_ID, 12_000)  # 12,000 objects: parsed, then bounded
    headers = {**alice_headers(), "Content-Type": "application/json"}
    with httpx.Client(base_url=server.url, timeout=120) as http:
        started = time.monotonic()
        response = http.post("/v1/chat/completions", content=raw, headers=headers)
        elapsed_s = time.monotonic() - started
        assert response.status_code == 400, response.text
        assert "characters" in response.json()["error"]["message"]
        assert response.json()["error"]["param"] == "tools"
        assert elapsed_s < 5, f"{elapsed_s:.1f} s before the 400"
        assert_still_serving(http)


def test_a_million_properties_are_refused_before_the_parse_freezes_the_server(
    server: ServerHandle,
) -> None:
    """The issue's forced call over ~1M properties: a 25 MB body whose parse held the GIL
    (and so /health) for a second or two, off the event loop or not."""
    raw = many_properties_body(MODEL_ID)
    answers, latencies = posted_while_probing_health(server, "/v1/chat/completions", raw, 3)
    for answer in answers:
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "body_too_complex"
    assert max(latencies) < HEALTH_BUDGET_S, f"/health took {max(latencies):.3f} s"


def test_a_long_conversation_is_prepared_off_the_loop_one_at_a_time_per_tenant(
    server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16,000 Anthropic turns, just under the body's object bound: converted to chat inputs
    (~130 ms of Python a request, once on the event loop) in a worker thread, one request of
    the tenant at a time; each is a clear 400 (the prompt cannot fit) and /health answers."""
    calls: list[tuple[bool, int]] = []  # (on the event loop, conversions running then)
    running, lock = [0], threading.Lock()
    convert = anthropic.chat_inputs

    def watched(conv: Any) -> Any:
        with lock:
            running[0] += 1
            calls.append((on_event_loop(), running[0]))
        try:
            return convert(conv)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(anthropic, "chat_inputs", watched)
    raw = many_turns_body(MODEL_ID)
    headers = {**alice_headers(), "Content-Type": "application/json"}
    with httpx.Client(base_url=server.url, timeout=60) as http, ThreadPoolExecutor(3) as pool:
        answers = list(
            pool.map(lambda _: http.post("/v1/messages", content=raw, headers=headers), range(3))
        )
    for answer in answers:
        assert answer.status_code == 400, answer.text
        assert "context" in answer.json()["error"]["message"]
    assert calls == [(False, 1)] * 3
    _, latencies = posted_while_probing_health(server, "/v1/messages", raw, 2)
    assert max(latencies) < HEALTH_BUDGET_S, f"/health took {max(latencies):.3f} s"


def on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("family", ["qwen3-coder", "glm", "minimax-m2", "lfm2"])
def test_a_forced_call_in_a_tagged_family_bounds_the_schemas_total(family: str) -> None:
    """Tagged and Python-call families convert each property on its own (each under the
    per-schema cap): the total is bounded before any is converted."""
    tools = json.loads(many_properties_body(MODEL_ID, 100_000))["tools"]
    started = time.monotonic()
    with pytest.raises(EngineError, match="characters"):
        forced_call_grammar(tools, None, FORMATS[family])
    assert time.monotonic() - started < 1


# --- image URLs -------------------------------------------------------------------------------


@pytest.fixture
def raw_http() -> Iterator[Callable[[Callable[[socket.socket], None]], str]]:
    """A one-connection HTTP server on loopback that answers with ``respond(conn)``."""
    listeners: list[socket.socket] = []

    def serve(respond: Callable[[socket.socket], None]) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def run() -> None:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                with contextlib.suppress(OSError):
                    respond(conn)

        threading.Thread(target=run, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}/cat.png"

    yield serve
    for listener in listeners:
        listener.close()


def dribble(conn: socket.socket) -> None:
    """A valid response, one byte every 0.3 s (for at most 30 s)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\n"
    data = head + b"X-Pad: " + b"a" * 200 + b"\r\n\r\n" + PNG
    for byte in data[:100]:
        conn.sendall(bytes([byte]))
        time.sleep(0.3)


POLICY = ImagePolicy(allow_urls=True, allow_private_urls=True, url_timeout_s=1.5)


def test_a_url_served_a_byte_at_a_time_ends_at_the_deadline(
    raw_http: Callable[[Callable[[socket.socket], None]], str],
) -> None:
    url = raw_http(dribble)
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"took more than 1\.5 s"):
        _chat_with(url, POLICY)
    assert time.monotonic() - started < 3


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (b"garbage\r\n\r\n", "BadStatusLine"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\nContent-Type: image/png\r\n\r\n" + PNG,
         "fail"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "fail"),
        (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 200 + b"\r\n", "fail"),
    ],
    ids=["bad-status-line", "incomplete-read", "bad-chunk", "too-many-headers"],
)  # fmt: skip
def test_broken_http_from_an_image_url_is_a_clear_refusal(
    raw_http: Callable[[Callable[[socket.socket], None]], str], reply: bytes, says: str
) -> None:
    url = raw_http(lambda conn: conn.sendall(reply))
    with pytest.raises(ValueError, match=says) as refused:
        _chat_with(url, POLICY)
    assert "image" in str(refused.value)


@pytest.fixture(scope="module")
def url_server(engine: Engine) -> Iterator[ServerHandle]:
    """The session's engine behind a server that fetches image URLs, loopback ones too."""
    config = ServerConfig(
        model_id=MODEL_ID, keys=make_keys(), default_max_tokens=4, allow_private_image_urls=True
    )
    handle = start_server(engine, config=config)
    yield handle
    handle.stop()


@pytest.mark.parametrize(
    "reply",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\nContent-Type: image/png\r\n\r\n" + PNG,
    ],
    ids=["bad-status-line", "incomplete-read"],
)
def test_broken_http_from_an_image_url_is_a_400_from_the_server(
    raw_http: Callable[[Callable[[socket.socket], None]], str],
    url_server: ServerHandle,
    reply: bytes,
) -> None:
    """``http.client``'s BadStatusLine and IncompleteRead were 500s."""
    url = raw_http(lambda conn: conn.sendall(reply))
    with httpx.Client(base_url=url_server.url, timeout=60) as http:
        response = http.post("/v1/chat/completions", json=chat_body(url), headers=alice_headers())
        assert response.status_code == 400, response.text
        assert "image" in response.json()["error"]["message"]
        assert_still_serving(http)


# --- keep_alive ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [int("9" * 400), "9" * 400, 1e308, float("inf"), float("nan"), "99999999h"]
)
def test_an_absurd_keep_alive_is_refused_clearly(value: Any) -> None:
    with pytest.raises(ConfigError, match="keep_alive"):
        parse_keep_alive(value)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(-int("9" * 400), None), (float("-inf"), None), ("10m", 600.0), (MAX_KEEP_ALIVE_S, None)],
)
def test_keep_alive_bounds(value: Any, seconds: float | None) -> None:
    expected = float(MAX_KEEP_ALIVE_S) if value == MAX_KEEP_ALIVE_S else seconds
    assert parse_keep_alive(value) == expected
