"""The event loop's own work per streamed token, counted (not timed): a 2x regression fails here.

On a 2-core machine the event loop's time per streamed token is time the decode waits for:
with the tiny model, the loop's CPU per token read 85-93 µs against llama-server's HTTP
threads' 64-67 µs, and 70 µs once the calls below went down by a fifth (benchmarks/RESULTS.md).
Counted as Python calls on the server's loop thread (``sys.setprofile``: every Python
function and every C function it calls) per streamed token: the difference between a long
and a short stream of the same request, so that what a request costs once (routing, parsing,
the template, the response's start) cancels out. Real server, real engine, tiny model.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import httpx
import pytest
from server_helpers import MODEL_ID, alice_headers

from homelab.server.middleware import RequestRecord
from homelab.server.runner import ServerHandle

NO_END = {"2": -100, "4": -100}  # ban </s> and <|im_end|>: every answer runs to max_tokens
SHORT_TOKENS, LONG_TOKENS = 40, 240
# per streamed token, measured (completions / chat / anthropic / responses): 34-37 / 46-48 /
# 44-49 / 48 here; 43-47 / 70-72 / 51 / 50-51 before the chunk was split once around its
# text (streaming.text_events, numbered_text_events), a queued event was taken without a
# call, a reader parked on a bare future (not an asyncio.Event) and a reply with nothing to
# parse took its tokens as content at once (ReplyStream.content). Since steady steps wake a
# reader at most once a millisecond and the chunks ready together go out in one write, 24 /
# 36 / 35 / 35 here (~3 tokens a wake at the tiny model's 0.3 ms steps); a machine whose
# steps take 1 ms or more wakes the reader for every token and reads the figures before
CALLS_PER_TOKEN_BUDGET = {"completions": 70, "chat": 95, "anthropic": 90, "responses": 100}


class LoopCallCounter:
    """Counts Python calls on the server's event loop thread, switched on and off from that
    thread by the request log (a subscriber runs on the loop after each request's response)."""

    def __init__(self) -> None:
        self.calls = 0
        self._switch: Callable[[FrameType, str, object], None] | None = None
        self._switched: threading.Event | None = None
        self._route = ""
        self._leave = False

    def _count(self, frame: FrameType, event: str, arg: object) -> None:
        if event in ("call", "c_call"):
            self.calls += 1

    def arm(self, route: str, on: bool | None) -> threading.Event:
        """The next log record of ``route`` switches counting on (True), off (False) or
        leaves it (None); the event is set once it has. A record comes after its response
        has been sent: a client can be done before it."""
        self._route, self._switch = route, self._count if on else None
        self._leave = on is None
        self._switched = threading.Event()
        return self._switched

    def on_record(self, record: RequestRecord) -> None:
        switched = self._switched
        if switched is None or record.route != self._route:
            return
        self._switched = None
        if not self._leave:
            sys.setprofile(self._switch)
        switched.set()


@pytest.fixture
def counter(server: ServerHandle) -> Iterator[LoopCallCounter]:
    counting = LoopCallCounter()
    unsubscribe = server.subscribe(counting.on_record)
    yield counting
    off = counting.arm("/health", False)  # never leave the shared server's loop profiled
    httpx.get(f"{server.url}/health", timeout=10)
    assert off.wait(10)
    unsubscribe()


def stream_body(kind: str, max_tokens: int) -> tuple[str, dict[str, object]]:
    body: dict[str, object] = {
        "model": MODEL_ID,
        "max_tokens": max_tokens,
        "stream": True,
        "seed": 7,
    }
    messages = [{"role": "user", "content": "the cache of the stream"}]
    # the Anthropic and Responses dialects take no logit_bias: greedy, the same tokens each time
    if kind == "anthropic":
        return "/v1/messages", {**body, "messages": messages, "temperature": 0.0}
    if kind == "responses":
        del body["max_tokens"], body["seed"]
        return "/v1/responses", {
            **body,
            "input": "the cache of the stream",
            "max_output_tokens": max_tokens,
            "temperature": 0.0,
        }
    body = {**body, "logit_bias": NO_END, "stream_options": {"include_usage": True}}
    if kind == "completions":
        return "/v1/completions", {**body, "prompt": "the cache of the stream"}
    return "/v1/chat/completions", {**body, "messages": messages}


def output_tokens(chunk: dict[str, Any]) -> int | None:
    """The completion tokens a chunk reports, if it does (OpenAI's usage chunk, Anthropic's
    message_delta, the Responses API's response.completed)."""
    usage = chunk.get("usage") or (chunk.get("response") or {}).get("usage") or {}
    return usage.get("completion_tokens", usage.get("output_tokens"))


def streamed_tokens(http: httpx.Client, kind: str, max_tokens: int) -> tuple[int, int]:
    """(completion tokens, chunks) of one streamed request."""
    path, body = stream_body(kind, max_tokens)
    tokens = chunks = 0
    with http.stream("POST", path, json=body, headers=alice_headers()) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line.removeprefix("data: "))
            chunks += 1
            tokens = output_tokens(chunk) or tokens
    return tokens, chunks


def counted_stream(
    http: httpx.Client, counter: LoopCallCounter, kind: str, max_tokens: int
) -> tuple[int, int]:
    """(loop calls, completion tokens) of one streamed request, counted from the log record
    of a request before it to that of the stream itself."""
    switched_on = counter.arm("/health", True)
    http.get("/health")  # its record switches counting on, on the loop thread
    assert switched_on.wait(10)
    counter.calls = 0
    path, _ = stream_body(kind, max_tokens)
    switched_off = counter.arm(path, False)
    tokens, chunks = streamed_tokens(http, kind, max_tokens)
    assert switched_off.wait(10)  # the stream's own record
    assert chunks >= tokens // 2  # the text really streamed chunk by chunk
    return counter.calls, tokens


@pytest.mark.parametrize("kind", ["completions", "chat", "anthropic", "responses"])
def test_loop_calls_per_streamed_token_stay_within_budget(
    server: ServerHandle, counter: LoopCallCounter, kind: str
) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        warmed = counter.arm(stream_body(kind, SHORT_TOKENS)[0], None)
        streamed_tokens(http, kind, SHORT_TOKENS)  # warm: graphs, template, parser made
        assert warmed.wait(10)  # its record is out of the way of the counted ones
        short_calls, short_tokens = counted_stream(http, counter, kind, SHORT_TOKENS)
        long_calls, long_tokens = counted_stream(http, counter, kind, LONG_TOKENS)
    assert short_tokens <= SHORT_TOKENS and long_tokens - short_tokens >= 100  # ran long
    per_token = (long_calls - short_calls) / (long_tokens - short_tokens)
    print(f"{kind}: {per_token:.1f} loop calls per streamed token")
    assert 0 < per_token < CALLS_PER_TOKEN_BUDGET[kind], f"{per_token:.0f} calls per token"
