"""Malformed and hostile Messages API requests: each gets its status and Anthropic's error
envelope ``{"type": "error", "error": {"type", "message"}}`` with a message that says what
was wrong, and the server keeps serving.

As in test_bad_requests.py: every case runs in-process against the fake engine (no model, no
sockets), and the cases marked ``live`` also run against the session's real server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_engine import FakeEngine
from fastapi import FastAPI
from server_helpers import ALICE_KEY, BOB_KEY, MODEL_ID, N_CTX_PER_SLOT, make_keys

from homelab.gguf.reader import read_model
from homelab.server.app import create_app
from homelab.server.config import ServerConfig

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
USER = [{"role": "user", "content": "hi"}]
KEY = {"x-api-key": ALICE_KEY}
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
}
BODY_CAP = 64 * 1024


@dataclass(frozen=True)
class Case:
    name: str
    status: int
    says: str  # part of the message (case-insensitive): it names what was wrong
    body: Any = None
    raw: bytes | None = None
    path: str = MESSAGES
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=lambda: dict(KEY))
    live: bool = False


def msg(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "max_tokens": 4, "messages": USER, **fields}


def turns(*messages: dict[str, Any]) -> dict[str, Any]:
    return msg(messages=list(messages))


def user(*blocks: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def assistant(*blocks: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def text(value: Any = "hi") -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool(**fields: Any) -> dict[str, Any]:
    return {"name": "get_time", "input_schema": {"type": "object"}, **fields}


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


USE = {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "noon"}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}

CASES = [
    # --- the body
    Case("bad json", 400, "not valid json", raw=b'{"model": "tiny", "messages": [', live=True),
    Case("empty body", 400, "not valid json", raw=b""),
    Case("array body", 400, "json object", body=[]),
    Case("deeply nested json", 400, "json", raw=b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    # --- max_tokens
    Case(
        "missing max_tokens",
        400,
        "max_tokens",
        body={"model": MODEL_ID, "messages": USER},
        live=True,
    ),
    Case("negative max_tokens", 400, "max_tokens", body=msg(max_tokens=-1)),
    Case("max_tokens as string", 400, "max_tokens", body=msg(max_tokens="8")),
    Case("max_tokens as float", 400, "max_tokens", body=msg(max_tokens=1.5)),
    Case("huge max_tokens", 400, "max_tokens", body=msg(max_tokens=10**12), live=True),
    Case("max_tokens beyond int64", 400, "max_tokens", body=msg(max_tokens=10**30)),
    # --- messages and roles
    Case("missing messages", 400, "messages", body={"model": MODEL_ID, "max_tokens": 4}),
    Case("empty messages", 400, "messages", body=msg(messages=[]), live=True),
    Case("messages not a list", 400, "messages", body=msg(messages="hi")),
    Case(
        "system role in messages",
        400,
        "role",
        body=turns({"role": "system", "content": "x"}, *USER),
    ),
    Case("tool role", 400, "role", body=turns({"role": "tool", "content": "x"})),
    Case(
        "assistant first",
        400,
        "first message",
        body=turns({"role": "assistant", "content": "hello"}, *USER),
        live=True,
    ),
    Case("content is a number", 400, "content", body=turns({"role": "user", "content": 5})),
    Case("content missing", 400, "content", body=turns({"role": "user"})),
    Case("empty content list", 400, "empty", body=turns(user(), assistant(text("ok")), *USER)),
    Case("empty text block", 400, "non-empty", body=turns(user(text("  ")))),
    Case("empty string content", 400, "non-empty", body=turns({"role": "user", "content": ""})),
    # --- content blocks
    Case("image block", 400, "image", body=turns(user(IMAGE)), live=True),
    Case("document block", 400, "document", body=turns(user({"type": "document"}))),
    Case("block without type", 400, "type", body=turns(user({"text": "hi"}))),
    Case("block type not a string", 400, "type", body=turns(user({"type": 7}))),
    Case("block is a string", 400, "type", body=turns(user("hi"))),
    Case("text not a string", 400, "text", body=turns(user(text(5)))),
    Case("tool_use in a user message", 400, "tool_use", body=turns(user(USE))),
    Case(
        "tool_result in an assistant message",
        400,
        "tool_result",
        body=turns(*USER, assistant(RESULT), *USER),
    ),
    Case("thinking in a user message", 400, "thinking", body=turns(user({"type": "thinking"}))),
    Case(
        "tool_use without input",
        400,
        "input",
        body=turns(*USER, assistant({"type": "tool_use", "id": "t", "name": "get_time"}), *USER),
    ),
    Case(
        "tool_result without tool_use",
        400,
        "tool_use",
        body=turns(*USER, assistant(text("ok")), user(RESULT)),
    ),
    Case(
        "tool_result for another id",
        400,
        "toolu_2",
        body=turns(*USER, assistant(USE), user({**RESULT, "tool_use_id": "toolu_2"})),
    ),
    Case(
        "tool_result with an image",
        400,
        "image",
        body=turns(*USER, assistant(USE), user({**RESULT, "content": [IMAGE]})),
    ),
    Case("final assistant tool_use", 400, "tool_use", body=turns(*USER, assistant(USE))),
    Case("system is a number", 400, "system", body=msg(system=5)),
    Case("system image block", 400, "image", body=msg(system=[IMAGE])),
    # --- sampling
    Case("temperature above one", 400, "temperature", body=msg(temperature=1.5)),
    Case(
        "temperature NaN",
        400,
        "temperature",
        raw=json.dumps(msg(temperature=0.5)).replace("0.5", "NaN").encode(),
    ),
    Case("top_p above one", 400, "top_p", body=msg(top_p=2)),
    Case("negative top_k", 400, "top_k", body=msg(top_k=-1)),
    Case("stop_sequences not a list", 400, "stop_sequences", body=msg(stop_sequences="x")),
    Case("seventeen stop sequences", 400, "stop_sequences", body=msg(stop_sequences=["a"] * 17)),
    Case("long stop sequence", 400, "stop sequence", body=msg(stop_sequences=["x" * 300])),
    Case("stream is a string", 400, "stream", body=msg(stream="yes")),
    # --- tools
    Case(
        "tool schema 200 levels deep",  # beyond what the JSON parser nests
        400,
        "recursion limit",
        body=msg(tools=[tool(input_schema={"type": "object", "properties": {"a": nested(100)}})]),
        live=True,
    ),
    Case(
        "tool schema 40 levels deep",  # parses, but deeper than any real tool's schema
        400,
        "nested more than",
        body=msg(tools=[tool(input_schema={"type": "object", "properties": {"a": nested(20)}})]),
    ),
    Case("tool without input_schema", 400, "input_schema", body=msg(tools=[{"name": "x"}])),
    Case(
        "tool schema not an object",
        400,
        "input_schema",
        body=msg(tools=[tool(input_schema={"type": "string"})]),
    ),
    Case("bad tool name", 400, "name", body=msg(tools=[tool(name="no spaces")])),
    Case(
        "server tool",
        400,
        "not supported",
        body=msg(tools=[{"type": "bash_20250124", "name": "bash"}]),
    ),
    Case("too many tools", 400, "tools", body=msg(tools=[tool(name=f"t{i}") for i in range(129)])),
    Case(
        "tool_choice any without tools", 400, "needs tools", body=msg(tool_choice={"type": "any"})
    ),
    Case(
        "tool_choice names a missing tool",
        400,
        "not in tools",
        body=msg(tools=[tool()], tool_choice={"type": "tool", "name": "other"}),
        live=True,
    ),
    Case(
        "tool_choice tool without name",
        400,
        "name",
        body=msg(tools=[tool()], tool_choice={"type": "tool"}),
    ),
    Case("tool_choice nonsense", 400, "tool_choice", body=msg(tool_choice={"type": "sometimes"})),
    Case("thinking nonsense", 400, "thinking", body=msg(thinking={"type": "deep"})),
    Case(
        "format with a forced tool",
        400,
        "output_config.format",
        body=msg(
            tools=[tool()],
            tool_choice={"type": "any"},
            output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}},
        ),
    ),
    Case(
        "format schema too deep",
        400,
        "schema",
        body=msg(output_config={"format": {"type": "json_schema", "schema": nested(40)}}),
    ),
    # --- context
    Case(
        "prompt far beyond context",
        400,
        "context",
        body=turns({"role": "user", "content": "the cache " * (N_CTX_PER_SLOT * 4)}),
        live=True,
    ),
    Case(
        "count_tokens beyond context",
        400,
        "context",
        path=COUNT,
        body={"model": MODEL_ID, "messages": [{"role": "user", "content": "cache " * 4000}]},
    ),
    Case("count_tokens without messages", 400, "messages", path=COUNT, body={"model": MODEL_ID}),
    # --- who and where
    Case("no key", 401, "x-api-key", body=msg(), headers={}, live=True),
    Case("wrong x-api-key", 401, "incorrect", body=msg(), headers={"x-api-key": "hl-guess"}),
    Case("empty x-api-key", 401, "malformed", body=msg(), headers={"x-api-key": ""}),
    Case(
        "x-api-key and bearer disagree",
        401,
        "different keys",
        body=msg(),
        headers={"x-api-key": ALICE_KEY, "Authorization": f"Bearer {BOB_KEY}"},
        live=True,
    ),
    Case("unknown model", 404, "claude-3-opus", body=msg(model="claude-3-opus"), live=True),
    Case("unknown model counted", 404, "gpt-4o", path=COUNT, body=msg(model="gpt-4o")),
    Case("unknown sub-route", 404, "unknown route", path="/v1/messages/batches", body=msg()),
    Case("wrong method", 405, "method", method="GET", live=True),
    Case("body over the cap", 413, "larger", raw=b'{"x": "' + b"a" * BODY_CAP + b'"}'),
]
LIVE_CASES = [case for case in CASES if case.live]


@pytest.fixture(scope="module")
def fast_app(demo_model: Callable[..., Path]) -> FastAPI:
    engine = FakeEngine(read_model(demo_model("llama")), N_CTX_PER_SLOT)
    config = ServerConfig(model_id=MODEL_ID, keys=make_keys(), max_body_bytes=BODY_CAP)
    return create_app(lambda: engine, config)


def request_of(case: Case) -> dict[str, Any]:
    content = case.raw if case.raw is not None else json.dumps(case.body).encode()
    headers = {"content-type": "application/json", **case.headers}
    if case.method == "GET":
        return {"method": "GET", "url": case.path, "headers": headers}
    return {"method": "POST", "url": case.path, "content": content, "headers": headers}


def assert_anthropic_error(case: Case, response: httpx.Response) -> None:
    assert response.status_code == case.status, response.text
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == TYPES[case.status]
    message = body["error"]["message"]
    assert case.says.lower() in message.lower(), message
    assert ALICE_KEY not in message and "Traceback" not in message


async def ask(app: FastAPI, **request: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return await client.request(**request)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_bad_request_gets_anthropic_error(case: Case, fast_app: FastAPI) -> None:
    assert_anthropic_error(case, await ask(fast_app, **request_of(case)))


@pytest.mark.parametrize("case", LIVE_CASES, ids=[c.name for c in LIVE_CASES])
def test_real_server_gives_the_same_errors(case: Case, http: httpx.Client) -> None:
    assert_anthropic_error(case, http.request(**request_of(case)))


def test_table_covers_the_route() -> None:
    assert len(CASES) >= 50
    assert 10 <= len(LIVE_CASES) < len(CASES) // 3


def test_fast_tier_still_serves_after_the_table(fast_app: FastAPI) -> None:
    async def table_then_good() -> httpx.Response:
        for case in CASES:
            await ask(fast_app, **request_of(case))
        return await ask(fast_app, method="POST", url=MESSAGES, json=msg(), headers=KEY)

    response = asyncio.run(table_then_good())
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["output_tokens"] == 4


def test_real_server_still_serves_after_the_table(http: httpx.Client) -> None:
    for case in LIVE_CASES:
        http.request(**request_of(case))
    response = http.post(MESSAGES, json=msg(max_tokens=2), headers=KEY)
    assert response.status_code == 200, response.text
    assert response.json()["type"] == "message"


def test_openai_routes_keep_the_openai_envelope(fast_app: FastAPI) -> None:
    body = {"model": MODEL_ID, "messages": USER, "max_tokens": 10**12}
    response = asyncio.run(ask(fast_app, method="POST", url="/v1/chat/completions", json=body))
    assert response.status_code == 401  # no key: the gate answers first, in OpenAI's shape
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_a_prefill_is_continued_not_repeated(fast_app: FastAPI) -> None:
    """A final assistant message is a prefill: the prompt ends with it, the reply follows."""
    engine = fast_app.state.homelab.engine()
    body = turns(*USER, assistant(text("The answer is")))
    response = asyncio.run(ask(fast_app, method="POST", url=MESSAGES, json=body, headers=KEY))
    assert response.status_code == 200, response.text
    prompt = bytes(t - 8 for t in engine.submitted[-1].prompt[1:]).decode()
    assert prompt.endswith("<|im_start|>assistant\nThe answer is")
