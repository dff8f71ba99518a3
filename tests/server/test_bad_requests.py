"""Malformed and hostile requests: each gets the exact status and OpenAI error envelope, and
the server keeps serving afterwards.

Two tiers: every case of the table runs in-process against a fake engine
(``httpx.ASGITransport``, no sockets, no model: see fake_engine.py), and the cases marked
``live`` also run against the real server and engine of the session, so the fast tier cannot
drift from what llama.cpp really does (vocabulary, template, context, grammar).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fake_engine import FakeEngine
from fastapi import FastAPI
from server_helpers import (
    ALICE_KEY,
    MODEL_ID,
    N_CTX_PER_SLOT,
    alice_headers,
    assert_still_serving,
    make_keys,
)

from homelab.engine.engine import Engine
from homelab.gguf.reader import read_model
from homelab.server.app import create_app
from homelab.server.auth import KeyRing, Tenant, TenantLimits
from homelab.server.config import ServerConfig
from homelab.server.runner import ServerHandle, start_server

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
}


@dataclass(frozen=True)
class Case:
    name: str
    status: int
    param: str | None
    code: str | None
    body: Any = None  # JSON-encoded unless ``raw`` is given
    raw: bytes | None = None
    path: str = CHAT
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=alice_headers)
    query: str = ""
    live: bool = False  # also run against the real server (engine-dependent, or one per kind)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "messages": USER, "max_tokens": 4, **fields}


def text(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "prompt": "hi", "max_tokens": 4, **fields}


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


HUGE_SCHEMA = {
    "type": "object",
    "properties": {f"field_{i}": {"type": "string"} for i in range(2000)},
}
FAR_TOO_LONG = "the cache " * (N_CTX_PER_SLOT * 4)

CASES = [
    # --- the body itself
    Case("bad json", 400, None, "invalid_json", raw=b'{"model": "tiny", "messages": [', live=True),
    Case("empty body", 400, None, "invalid_json", raw=b""),
    Case("not utf-8", 400, None, "invalid_json", raw=b"\xff\xfe{}"),
    Case("array body", 400, None, "invalid_body", body=[]),
    Case("string body", 400, None, "invalid_body", body="hello"),
    Case(
        "deeply nested json",
        400,
        None,
        "invalid_json",
        raw=b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    ),
    # --- messages
    Case(
        "missing messages",
        400,
        "messages",
        "missing_required_parameter",
        body={"model": MODEL_ID},
        live=True,
    ),
    Case("missing model", 400, "model", "missing_required_parameter", body={"messages": USER}),
    Case("empty messages", 400, "messages", "invalid_value", body=chat(messages=[])),
    Case("messages not a list", 400, "messages", "invalid_value", body=chat(messages="hi")),
    Case(
        "unknown role",
        400,
        "messages[0].role",
        "invalid_value",
        body=chat(messages=[{"role": "wizard", "content": "x"}]),
    ),
    Case(
        "content is a number",
        400,
        "messages[0].content",
        "invalid_value",
        body=chat(messages=[{"role": "user", "content": 5}]),
    ),
    Case(
        "image content",
        400,
        "messages[0].content",
        "invalid_value",
        body=chat(
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        ),
    ),
    Case(
        "user without content",
        400,
        "messages[1]",
        "invalid_value",
        body=chat(messages=[*USER, {"role": "user"}]),
    ),
    # --- sampling ranges and types
    Case("temperature string", 400, "temperature", "invalid_value", body=chat(temperature="hot")),
    Case("temperature too high", 400, "temperature", "invalid_value", body=chat(temperature=3.5)),
    Case(
        "temperature NaN",
        400,
        "temperature",
        "invalid_value",
        raw=json.dumps(chat(temperature=0.5)).replace("0.5", "NaN").encode(),
        live=True,
    ),
    Case("top_p zero", 400, "top_p", "invalid_value", body=chat(top_p=0)),
    Case("top_p above one", 400, "top_p", "invalid_value", body=chat(top_p=1.5)),
    Case(
        "presence penalty out of range",
        400,
        "presence_penalty",
        "invalid_value",
        body=chat(presence_penalty=5),
    ),
    Case("max_tokens zero", 400, "max_tokens", "invalid_value", body=chat(max_tokens=0)),
    Case("max_tokens negative", 400, "max_tokens", "invalid_value", body=chat(max_tokens=-5)),
    Case("max_tokens as string", 400, "max_tokens", "invalid_value", body=chat(max_tokens="10")),
    Case("huge max_tokens", 400, "max_tokens", "invalid_value", body=chat(max_tokens=10**12)),
    Case(
        "max_tokens beyond int64", 400, "max_tokens", "invalid_value", body=chat(max_tokens=10**30)
    ),
    Case("n zero", 400, "n", "invalid_value", body=chat(n=0)),
    Case("n over the server cap", 400, "n", "invalid_value", body=chat(n=17)),
    Case(
        "five stop strings", 400, "stop", "invalid_value", body=chat(stop=["a", "b", "c", "d", "e"])
    ),
    Case("stop is a number", 400, "stop", "invalid_value", body=chat(stop=7)),
    Case("seed is a string", 400, "seed", "invalid_value", body=chat(seed="42")),
    Case("stream is a string", 400, "stream", "invalid_value", body=chat(stream="yes")),
    Case(
        "stream_options without stream",
        400,
        "stream_options",
        "invalid_value",
        body=chat(stream_options={"include_usage": True}),
        live=True,
    ),
    Case(
        "stream_options with stream false",
        400,
        "stream_options",
        "invalid_value",
        path=TEXT,
        body=text(stream=False, stream_options={"include_usage": False}),
    ),
    Case(
        "logit_bias negative id",
        400,
        "logit_bias",
        "invalid_value",
        body=chat(logit_bias={"-1": 5}),
    ),
    Case(
        "logit_bias out of vocab",
        400,
        "logit_bias",
        "invalid_value",
        body=chat(logit_bias={"999999": 5}),
        live=True,
    ),
    Case(
        "logit_bias word key",
        400,
        "logit_bias",
        "invalid_value",
        body=chat(logit_bias={"hello": 5}),
    ),
    Case(
        "logit_bias value too big",
        400,
        "logit_bias",
        "invalid_value",
        body=chat(logit_bias={"5": 500}),
    ),
    Case(
        "top_logprobs too many",
        400,
        "top_logprobs",
        "invalid_value",
        body=chat(logprobs=True, top_logprobs=50),
    ),
    Case(
        "top_logprobs without logprobs",
        400,
        "top_logprobs",
        "invalid_value",
        body=chat(top_logprobs=2),
    ),
    # --- structured output and tools
    Case(
        "unknown response format",
        400,
        "response_format.type",
        "invalid_value",
        body=chat(response_format={"type": "xml"}),
    ),
    Case(
        "json_schema missing",
        400,
        "response_format",
        "invalid_value",
        body=chat(response_format={"type": "json_schema"}),
    ),
    Case(
        "deep json schema",
        400,
        "response_format",
        "invalid_value",
        body=chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": nested(40)},
            }
        ),
        live=True,
    ),
    Case(
        "huge json schema",
        400,
        "response_format",
        "invalid_value",
        body=chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": HUGE_SCHEMA},
            }
        ),
    ),
    Case(
        "bad tool name",
        400,
        "tools[0].function.name",
        "invalid_value",
        body=chat(tools=[{"type": "function", "function": {"name": "no spaces allowed"}}]),
    ),
    Case(
        "tool_choice not in tools",
        400,
        "tool_choice",
        "invalid_value",
        body=chat(
            tools=[{"type": "function", "function": {"name": "a"}}],
            tool_choice={"type": "function", "function": {"name": "b"}},
        ),
        live=True,
    ),
    Case(
        "tool_choice nonsense",
        400,
        "tool_choice",
        "invalid_value",
        body=chat(tool_choice="sometimes"),
    ),
    # --- context
    Case(
        "prompt far beyond context",
        400,
        "messages",
        "context_length_exceeded",
        body=chat(messages=[{"role": "user", "content": FAR_TOO_LONG}]),
        live=True,
    ),
    Case(
        "prompt plus max_tokens beyond context",
        400,
        "messages",
        "context_length_exceeded",
        body=chat(
            messages=[{"role": "user", "content": "the cache " * 10}],
            max_tokens=N_CTX_PER_SLOT - 10,
        ),
        live=True,
    ),
    Case(
        "completion prompt far beyond context",
        400,
        "messages",
        "context_length_exceeded",
        path=TEXT,
        body=text(prompt=FAR_TOO_LONG),
        live=True,
    ),
    # --- text completions
    Case("empty prompt list", 400, "prompt", "invalid_value", path=TEXT, body=text(prompt=[])),
    Case(
        "prompt token out of vocab",
        400,
        "prompt",
        "invalid_value",
        path=TEXT,
        body=text(prompt=[1, 999999]),
        live=True,
    ),
    Case(
        "prompt token negative",
        400,
        "prompt",
        "invalid_value",
        path=TEXT,
        body=text(prompt=[1, -4]),
    ),
    Case(
        "prompt mixed types", 400, "prompt", "invalid_value", path=TEXT, body=text(prompt=["a", 5])
    ),
    Case("suffix unsupported", 400, "suffix", "invalid_value", path=TEXT, body=text(suffix="end")),
    Case(
        "echo with logprobs",
        400,
        "logprobs",
        "invalid_value",
        path=TEXT,
        body=text(echo=True, logprobs=2),
    ),
    # --- who and where
    Case("no authorization", 401, None, "invalid_api_key", body=chat(), headers={}, live=True),
    Case(
        "basic auth scheme",
        401,
        None,
        "invalid_api_key",
        body=chat(),
        headers={"Authorization": "Basic YWxpY2U6cHc="},
    ),
    Case(
        "empty bearer",
        401,
        None,
        "invalid_api_key",
        body=chat(),
        headers={"Authorization": "Bearer"},
    ),
    Case(
        "bearer with spaces",
        401,
        None,
        "invalid_api_key",
        body=chat(),
        headers={"Authorization": "Bearer a b"},
    ),
    Case(
        "wrong key",
        401,
        None,
        "invalid_api_key",
        body=chat(),
        headers={"Authorization": "Bearer hl-guess"},
    ),
    Case(
        "key in query string",
        401,
        None,
        "invalid_api_key",
        body=chat(),
        headers={},
        query=f"?api_key={ALICE_KEY}",
    ),
    Case(
        "key in query string and header",
        401,
        None,
        "invalid_api_key",
        body=chat(),
        query=f"?api_key={ALICE_KEY}",
        live=True,
    ),
    Case("unknown model", 404, "model", "model_not_found", body=chat(model="gpt-4o"), live=True),
    Case("unknown route", 404, None, "unknown_route", path="/v1/engines", body=chat(), live=True),
    Case("wrong method", 405, None, "method_not_allowed", method="GET", live=True),
]


LIVE_CASES = [case for case in CASES if case.live]


@pytest.fixture(scope="module")
def fast_app(demo_model: Callable[..., Path]) -> FastAPI:
    """The app over a fake engine, configured like the session's real server."""
    engine = FakeEngine(read_model(demo_model("llama")), N_CTX_PER_SLOT)
    config = ServerConfig(model_id=MODEL_ID, keys=make_keys(), default_max_tokens=32)
    return create_app(lambda: engine, config)


def _request(case: Case) -> dict[str, Any]:
    content = case.raw if case.raw is not None else json.dumps(case.body).encode()
    headers = {"Content-Type": "application/json", **case.headers}
    if case.method == "GET":
        return {"method": "GET", "url": case.path + case.query, "headers": headers}
    return {"method": "POST", "url": case.path + case.query, "content": content, "headers": headers}


def assert_exact_error(case: Case, response: httpx.Response) -> None:
    assert response.status_code == case.status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == ERROR_TYPES[case.status]
    assert (error["param"], error["code"]) == (case.param, case.code)
    assert isinstance(error["message"], str) and error["message"]
    assert ALICE_KEY not in error["message"]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_bad_request_gets_exact_error(case: Case, fast_app: FastAPI) -> None:
    transport = httpx.ASGITransport(fast_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        response = await client.request(**_request(case))
    assert_exact_error(case, response)


@pytest.mark.parametrize("case", LIVE_CASES, ids=[c.name for c in LIVE_CASES])
def test_real_server_gives_the_same_errors(case: Case, http: httpx.Client) -> None:
    assert_exact_error(case, http.request(**_request(case)))


def test_fast_tier_answers_well_formed_requests_too(fast_app: FastAPI) -> None:
    """The fake engine generates, so the fast tier also sees a 200 through the same routes."""

    async def ask() -> httpx.Response:
        transport = httpx.ASGITransport(fast_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.post(CHAT, json=chat(max_tokens=3), headers=alice_headers())

    response = asyncio.run(ask())
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 3


def test_table_is_big_enough() -> None:
    assert len(CASES) >= 30
    assert 10 <= len(LIVE_CASES) < len(CASES) // 2


def test_a_million_token_prompt_is_refused_in_under_a_second(engine: Engine) -> None:
    """Refused before llama.cpp tokenizes it whole (that grows with the square of its special
    tokens): the same 400 as any prompt beyond the context, whatever the prompt's size."""
    text_prompt = "the cache " * 250_000  # 2.5 MB: about a million tokens of this vocabulary
    many_turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "the cache " * 4}
        for i in range(15_000)
    ]  # where tokenizing is quadratic: two special tokens per message (more: body_too_complex)
    app = create_app(lambda: engine, ServerConfig(model_id=MODEL_ID, max_body_bytes=64 << 20))
    requests = [
        (CHAT, chat(messages=[{"role": "user", "content": text_prompt}])),
        (TEXT, text(prompt=text_prompt)),
        (CHAT, chat(messages=many_turns)),
    ]

    async def ask(path: str, body: dict[str, Any]) -> tuple[httpx.Response, float]:
        transport = httpx.ASGITransport(app)
        content = json.dumps(body).encode()
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            started = time.perf_counter()
            response = await client.post(path, content=content, headers={"Content-Type": "json"})
            return response, time.perf_counter() - started

    for path, body in requests:
        response, elapsed_s = asyncio.run(ask(path, body))
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["param"], error["code"]) == ("messages", "context_length_exceeded")
        assert f"context per request is {N_CTX_PER_SLOT} tokens" in error["message"]
        assert elapsed_s < 1.0, f"{path}: {elapsed_s:.2f} s to refuse"


def test_server_still_serves_after_the_table(http: httpx.Client) -> None:
    for case in CASES[:10]:
        http.post(
            case.path, content=case.raw or json.dumps(case.body).encode(), headers=case.headers
        )
    assert_still_serving(http)


def test_unknown_fields_and_llamacpp_slot_knobs_are_ignored(http: httpx.Client) -> None:
    knobs = {
        "id_slot": 3,
        "cache_prompt": False,
        "n_keep": -1,
        "n_discard": 7,
        "cache_salt": "x",
        "mystery": {"a": [1]},
    }
    response = http.post(CHAT, json=chat(**knobs), headers=alice_headers())
    assert response.status_code == 200, response.text


# --- a second server with tight limits, sharing the session's engine -----------------------

NO_END = {"2": -100, "4": -100}  # ban </s> and <|im_end|>: generation runs to max_tokens
LIMITED_KEY = "hl-test-limited"
SLOW_KEY = "hl-test-slow"
SMALL_BODY_BYTES = 4096


@pytest.fixture(scope="module")
def limited(engine: Engine) -> Iterator[httpx.Client]:
    keys = KeyRing.from_keys(
        {
            LIMITED_KEY: Tenant("limited", limits=TenantLimits(max_concurrent_requests=1)),
            SLOW_KEY: Tenant("slow", limits=TenantLimits(requests_per_minute=2)),
        }
    )
    config = ServerConfig(model_id=MODEL_ID, keys=keys, max_body_bytes=SMALL_BODY_BYTES)
    handle: ServerHandle = start_server(engine, config=config)
    with httpx.Client(base_url=handle.url, timeout=60) as plain:
        yield plain
    handle.stop()


def test_body_over_the_cap_is_413_before_parsing(limited: httpx.Client) -> None:
    headers = {"Authorization": f"Bearer {LIMITED_KEY}", "Content-Type": "application/json"}
    big = b'{"model": "tiny", "messages": [' + b" " * SMALL_BODY_BYTES + b"]"  # not even valid JSON
    response = limited.post(CHAT, content=big, headers=headers)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted while reading
        for _ in range(8):
            yield b" " * 1024

    response = limited.post(CHAT, content=chunked(), headers=headers)
    assert response.status_code == 413


def test_concurrency_limit_is_429_with_retry_after(limited: httpx.Client) -> None:
    headers = {"Authorization": f"Bearer {LIMITED_KEY}"}
    host, port = limited.base_url.host, limited.base_url.port
    head = f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {LIMITED_KEY}\r\n"
    with (
        socket.create_connection((host, port)) as slow_upload,
        httpx.Client(base_url=limited.base_url) as fresh,
    ):
        # the gate admits a request before reading its body: this one holds the tenant's only
        # slot while its body is still "uploading"
        slow_upload.sendall(
            f"{head}Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{".encode()
        )
        time.sleep(0.3)  # let the server read its headers before anything else arrives
        second = fresh.post(CHAT, json=chat(), headers=headers)
        assert second.status_code == 429, second.text
        assert second.json()["error"]["type"] == "rate_limit_error"
        assert int(second.headers["Retry-After"]) >= 1
    deadline = time.monotonic() + 10  # the slot comes back once the server sees the hang-up
    while (after := limited.post(CHAT, json=chat(), headers=headers)).status_code == 429:
        assert time.monotonic() < deadline, "the closed request never released its slot"
        time.sleep(0.05)
    assert after.status_code == 200


def test_rate_limit_is_429_with_retry_after(limited: httpx.Client) -> None:
    headers = {"Authorization": f"Bearer {SLOW_KEY}"}
    statuses = [
        limited.post(CHAT, json=chat(max_tokens=1), headers=headers).status_code for _ in range(3)
    ]
    assert statuses == [200, 200, 429]
    refused = limited.post(CHAT, json=chat(max_tokens=1), headers=headers)
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    base_url = str(limited.base_url).rstrip("/") + "/v1"
    with (
        openai.OpenAI(base_url=base_url, api_key=SLOW_KEY, max_retries=0) as sdk,
        pytest.raises(openai.RateLimitError),
    ):
        sdk.chat.completions.create(model=MODEL_ID, messages=USER, max_tokens=1)  # type: ignore[arg-type]
