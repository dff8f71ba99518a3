"""Hostile and malformed ``/v1/responses`` requests: each gets a clear 400 (or 404) in OpenAI's
error envelope naming the Responses parameter, nothing reaches the engine, and the server
keeps serving.

Fast tier: every case in-process over the fake engine (fake_engine.py: the demo model's real
chat template, byte tokens). Cases marked ``live`` also run against the session's real server.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_engine import FakeEngine
from fastapi import FastAPI
from server_helpers import ALICE_KEY, MODEL_ID, alice_headers, make_keys

from homelab.gguf.reader import read_model
from homelab.server.app import create_app
from homelab.server.config import ServerConfig
from homelab.server.runner import ServerHandle

PATH = "/v1/responses"
TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@dataclass(frozen=True)
class Case:
    name: str
    param: str | None
    code: str
    body: Any
    status: int = 400
    live: bool = False


def resp(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "input": "hi", "max_output_tokens": 4, **fields}


def deep_tool(depth: int) -> dict[str, Any]:
    return {"type": "function", "name": "f", "parameters": nested(depth)}


CASES = [
    # --- what needs stored state
    Case("unknown previous_response_id", "previous_response_id", "response_not_found",
         resp(previous_response_id="resp_abc"), status=404, live=True),
    Case("background", "background", "invalid_value", resp(background=True)),
    Case("conversation", "conversation", "invalid_value", resp(conversation="conv_1")),
    Case("stored prompt", "prompt", "invalid_value", resp(prompt={"id": "pmpt_1"})),
    Case("item reference", "input[0]", "invalid_value",
         resp(input=[{"type": "item_reference", "id": "msg_1"}])),
    # --- input
    Case("missing input", "input", "missing_required_parameter", {"model": MODEL_ID}, live=True),
    Case("null input", "input", "invalid_value", resp(input=None)),
    Case("empty input list", "input", "invalid_value", resp(input=[]), live=True),
    Case("input is a number", "input", "invalid_value", resp(input=5)),
    Case("item not an object", "input[0]", "invalid_value", resp(input=["hi"])),
    Case("unknown item type", "input[0].type", "invalid_value",
         resp(input=[{"type": "web_search_call", "id": "ws_1"}]), live=True),
    Case("message without role", "input[0].type", "invalid_value",
         resp(input=[{"content": "hi"}])),
    Case("tool role", "input[0].role", "invalid_value",
         resp(input=[{"role": "tool", "content": "hi"}])),
    Case("image not a data URL", "input", "invalid_value",  # more: test_image_requests.py
         resp(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
         live=True),
    Case("audio part", "input[0].content[0].type", "invalid_value",
         resp(input=[{"role": "user", "content": [{"type": "input_audio", "data": "x"}]}])),
    Case("part without text", "input[0].content[0].text", "invalid_value",
         resp(input=[{"role": "user", "content": [{"type": "input_text"}]}])),
    Case("content not text", "input[0].content", "invalid_value",
         resp(input=[{"role": "user", "content": {"text": "hi"}}])),
    Case("call without call_id", "input[1].call_id", "invalid_value",
         resp(input=[{"role": "user", "content": "hi"},
                     {"type": "function_call", "name": "f", "arguments": "{}"}])),
    Case("call output without call_id", "input[0].call_id", "invalid_value",
         resp(input=[{"type": "function_call_output", "output": "4"}])),
    Case("only instructions", "input", "invalid_value",
         resp(instructions="be brief", input=[{"type": "reasoning", "summary": []}])),
    # --- limits
    Case("huge max_output_tokens", "max_output_tokens", "invalid_value",
         resp(max_output_tokens=10**12), live=True),
    Case("max_output_tokens beyond int64", "max_output_tokens", "invalid_value",
         resp(max_output_tokens=10**30)),
    Case("max_output_tokens zero", "max_output_tokens", "invalid_value",
         resp(max_output_tokens=0)),
    Case("temperature too high", "temperature", "invalid_value", resp(temperature=5)),
    Case("input beyond the context", "input", "context_length_exceeded",
         resp(input="the cache " * 2000), live=True),
    # --- tools and formats
    Case("tool schema 200 deep", None, "invalid_json", resp(tools=[deep_tool(200)]), live=True),
    Case("forced tool schema 30 deep", "tools", "invalid_value",
         resp(tools=[deep_tool(30)], tool_choice="required"), live=True),
    Case("tool without a type", "tools[0].type", "missing_required_parameter",
         resp(tools=[{"name": "web_search"}])),
    Case("bad tool name", "tools[0].name", "invalid_value",
         resp(tools=[{"type": "function", "name": "no spaces"}])),
    Case("too many tools", "tools", "invalid_value", resp(tools=[TOOL] * 129)),
    Case("tool_choice unknown function", "tool_choice", "invalid_value",
         resp(tools=[TOOL], tool_choice={"type": "function", "name": "g"})),
    Case("tool_choice hosted", "tool_choice", "invalid_value",
         resp(tools=[TOOL], tool_choice={"type": "file_search"})),
    Case("json_schema without schema", "text.format", "invalid_value",
         resp(text={"format": {"type": "json_schema", "name": "x"}})),
    Case("json_schema 40 deep", "text.format", "invalid_value",
         resp(text={"format": {"type": "json_schema", "name": "x", "schema": nested(40)}}),
         live=True),
    Case("unknown format", "text.format.type", "invalid_value",
         resp(text={"format": {"type": "yaml"}})),
    Case("format with forced tool", "text.format", "invalid_value",
         resp(tools=[TOOL], tool_choice="required", text={"format": {"type": "json_object"}})),
    Case("wrong model", "model", "model_not_found", resp(model="gpt-5"), status=404, live=True),
]  # fmt: skip
LIVE_CASES = [case for case in CASES if case.live]


@pytest.fixture(scope="module")
def fake_engine(demo_model: Callable[..., Path]) -> FakeEngine:
    return FakeEngine(read_model(demo_model("llama")), 512)


@pytest.fixture(scope="module")
def fast_app(fake_engine: FakeEngine) -> FastAPI:
    config = ServerConfig(model_id=MODEL_ID, keys=make_keys(), default_max_tokens=32)
    return create_app(lambda: fake_engine, config)


async def post(app: FastAPI, body: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return await client.post(PATH, content=json.dumps(body), headers=alice_headers())


def assert_error(case: Case, response: httpx.Response) -> None:
    assert response.status_code == case.status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"]) == (case.param, case.code), error
    assert error["message"] and ALICE_KEY not in error["message"] and len(error["message"]) < 600


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_bad_responses_request_gets_a_clear_error(
    case: Case, fast_app: FastAPI, fake_engine: FakeEngine
) -> None:
    before = len(fake_engine.submitted)
    assert_error(case, await post(fast_app, case.body))
    assert len(fake_engine.submitted) == before  # nothing reached the engine
    ok = await post(fast_app, resp())
    assert ok.status_code == 200 and ok.json()["status"] == "incomplete"


async def test_fast_tier_output_and_stream_shapes(fast_app: FastAPI) -> None:
    """The fake engine always stops on length: incomplete, with the reason, streamed too."""
    body = (await post(fast_app, resp(max_output_tokens=3))).json()
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["output_tokens"] == 3 and body["store"] is True
    stream = await post(fast_app, resp(max_output_tokens=3, stream=True))
    events = [line[7:] for line in stream.text.splitlines() if line.startswith("event: ")]
    assert events[0] == "response.created" and events[-1] == "response.incomplete"
    assert "[DONE]" not in stream.text


@pytest.mark.parametrize("case", LIVE_CASES, ids=[c.name for c in LIVE_CASES])
def test_bad_responses_request_live(case: Case, server: ServerHandle) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        assert_error(case, http.post(PATH, content=json.dumps(case.body), headers=alice_headers()))
        ok = http.post(PATH, json=resp(max_output_tokens=2), headers=alice_headers())
    assert ok.status_code == 200 and ok.json()["usage"]["output_tokens"] >= 1
