"""The official ``anthropic`` SDK, unmodified, against the real server and engine of the session
(tiny llama demo model): what Claude Code or a script written for Claude would send."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from server_helpers import ALICE_KEY, BOB_KEY, MODEL_ID, N_CTX_PER_SLOT, assert_still_serving

from homelab.engine.engine import Engine
from homelab.server.anthropic_protocol import MessageResponse
from homelab.server.auth import KeyRing, Tenant, TenantLimits
from homelab.server.config import ServerConfig
from homelab.server.middleware import RequestRecord
from homelab.server.runner import ServerHandle, start_server

ASK = [{"role": "user", "content": "hello world, tell me about the cache"}]
WEATHER = {
    "name": "get_weather",
    "description": "current weather",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]}},
        "required": ["city"],
    },
}
CLOCK = {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}


@pytest.fixture
def claude(server: ServerHandle) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.url, api_key=ALICE_KEY, max_retries=0) as sdk:
        yield sdk


GREEDY = {"temperature": 0}  # this SDK has no sampling arguments; the API still takes them


def create(claude: anthropic.Anthropic, sampling: dict[str, Any] = GREEDY, **params: Any) -> Any:
    params = {"model": MODEL_ID, "max_tokens": 12, "messages": ASK, **params}
    return claude.messages.create(**params, extra_body=sampling)


def text_of(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_create_with_system_prompt_and_turns(claude: anthropic.Anthropic) -> None:
    message = create(
        claude,
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
            {"role": "user", "content": [{"type": "text", "text": "tell me about the cache"}]},
        ],
        metadata={"user_id": "someone"},
        sampling={"temperature": 0.5, "top_k": 20, "top_p": 0.9},
    )
    MessageResponse.model_validate(message.model_dump())  # our documented schema
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == MODEL_ID
    assert all(block.type == "text" for block in message.content)
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 12
    if message.usage.output_tokens == 12:
        assert message.stop_reason == "max_tokens"


def test_greedy_is_deterministic(claude: anthropic.Anthropic) -> None:
    assert text_of(create(claude)) == text_of(create(claude))


def test_max_tokens_beyond_the_context_is_clamped(claude: anthropic.Anthropic) -> None:
    long_ask = [{"role": "user", "content": "the cache " * 110}]  # ~70 tokens of room left
    message = create(claude, max_tokens=20_000, messages=long_ask)  # Claude Code asks 32000
    total = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert total + message.usage.output_tokens <= N_CTX_PER_SLOT
    assert message.stop_reason in ("end_turn", "max_tokens")


def test_stop_sequence_ends_the_text_and_is_named(claude: anthropic.Anthropic) -> None:
    text = text_of(create(claude, max_tokens=16))
    stop = text[3:5] if len(text) >= 5 and text[3:5].strip() else text[:2]
    message = create(claude, max_tokens=16, stop_sequences=["never-there", stop])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert text_of(message) == text[: text.find(stop)]


def test_stream_sends_the_event_sequence(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model=MODEL_ID,
        max_tokens=12,
        messages=ASK,  # type: ignore[arg-type]
        extra_body=GREEDY,
    ) as s:
        events = [event.type for event in s]
        final = s.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert events[-2] == "message_delta"
    body = events[1:-2]
    assert body[0] == "content_block_start" and body[-1] == "content_block_stop"
    assert set(body) <= {"content_block_start", "content_block_delta", "content_block_stop", "text"}
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0
    assert text_of(final) == text_of(create(claude))  # the same greedy text, streamed


def test_raw_stream_has_ping_and_named_events(server: ServerHandle) -> None:
    body = {"model": MODEL_ID, "max_tokens": 4, "messages": ASK, "stream": True}
    response = httpx.post(server.url + "/v1/messages", json=body, headers={"x-api-key": ALICE_KEY})
    assert response.headers["content-type"].startswith("text/event-stream")
    names = [line[7:] for line in response.text.splitlines() if line.startswith("event: ")]
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"
    assert "data: [DONE]" not in response.text


def test_tools_round_trip(claude: anthropic.Anthropic) -> None:
    message = create(claude, max_tokens=128, tools=[WEATHER, CLOCK], tool_choice={"type": "any"})
    assert message.stop_reason == "tool_use"
    call = next(block for block in message.content if block.type == "tool_use")
    assert call.id.startswith("toolu_") and call.name in ("get_weather", "get_time")
    if call.name == "get_weather":
        assert call.input["city"] in ("Oslo", "Paris")
    answer = create(
        claude,
        max_tokens=8,
        tools=[WEATHER, CLOCK],
        messages=[
            *ASK,
            {"role": "assistant", "content": [block.model_dump() for block in message.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"},
                    {"type": "text", "text": "so?"},
                ],
            },
        ],
    )
    assert answer.type == "message" and answer.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_named_tool_choice_and_streamed_tool_input(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model=MODEL_ID,
        max_tokens=128,
        messages=ASK,
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY,
    ) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "input_json_delta" in deltas and final.stop_reason == "tool_use"
    call = next(block for block in final.content if block.type == "tool_use")
    assert call.name == "get_weather" and call.input["city"] in ("Oslo", "Paris")


def test_count_tokens_matches_what_create_reads(claude: anthropic.Anthropic) -> None:
    params = {"model": MODEL_ID, "messages": ASK, "system": "You are terse."}
    counted = claude.messages.count_tokens(**params).input_tokens  # type: ignore[arg-type]
    message = create(claude, max_tokens=1, **params)
    assert counted == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    longer = claude.messages.count_tokens(
        model=MODEL_ID, messages=[{"role": "user", "content": "the cache " * 20}]
    ).input_tokens
    assert longer > counted
    with_tools = claude.messages.count_tokens(tools=[WEATHER], **params).input_tokens  # type: ignore[arg-type]
    assert with_tools > counted  # the template renders the tools into the prompt


def test_errors_are_the_sdks_typed_exceptions(server: ServerHandle) -> None:
    with anthropic.Anthropic(base_url=server.url, api_key=ALICE_KEY, max_retries=0) as claude:
        with pytest.raises(anthropic.BadRequestError) as bad:
            create(claude, max_tokens=10**7, stream=True)  # the SDK wants a stream for this
        assert bad.value.body["type"] == "error"  # type: ignore[index]
        assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        with pytest.raises(anthropic.BadRequestError):
            create(claude, messages=[])
        with pytest.raises(anthropic.NotFoundError) as missing:
            create(claude, model="claude-sonnet-4-5")
        assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with (
        anthropic.Anthropic(base_url=server.url, api_key="hl-wrong", max_retries=0) as stranger,
        pytest.raises(anthropic.AuthenticationError) as denied,
    ):
        create(stranger)
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_rate_limit_is_the_sdks_rate_limit_error(engine: Engine) -> None:
    keys = KeyRing.from_keys(
        {"hl-once": Tenant("once", limits=TenantLimits(requests_per_minute=1))}
    )
    handle = start_server(engine, config=ServerConfig(model_id=MODEL_ID, keys=keys))
    try:
        with anthropic.Anthropic(base_url=handle.url, api_key="hl-once", max_retries=0) as claude:
            create(claude, max_tokens=1)
            with pytest.raises(anthropic.RateLimitError) as limited:
                create(claude, max_tokens=1)
        assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
        assert int(limited.value.response.headers["retry-after"]) >= 1
    finally:
        handle.stop()


def test_x_api_key_and_bearer_reach_the_same_tenant(server: ServerHandle) -> None:
    seen: list[RequestRecord] = []
    unsubscribe = server.subscribe(seen.append)
    try:
        with (
            anthropic.Anthropic(base_url=server.url, api_key=ALICE_KEY, max_retries=0) as by_key,
            anthropic.Anthropic(
                base_url=server.url, auth_token=ALICE_KEY, max_retries=0
            ) as by_token,
        ):
            create(by_key, max_tokens=1)
            create(by_token, max_tokens=1)
        both = {"x-api-key": ALICE_KEY, "Authorization": f"Bearer {BOB_KEY}"}
        body = {"model": MODEL_ID, "max_tokens": 1, "messages": ASK}
        mixed = httpx.post(server.url + "/v1/messages", json=body, headers=both)
    finally:
        unsubscribe()
    assert [r.tenant for r in seen if r.route == "/v1/messages" and r.status == 200] == [
        "alice",
        "alice",
    ]
    assert mixed.status_code == 401 and mixed.json()["error"]["type"] == "authentication_error"


def test_openai_routes_keep_their_envelope(server: ServerHandle) -> None:
    body = {"model": "nope", "messages": ASK, "max_tokens": 1}
    response = httpx.post(
        server.base_url + "/chat/completions", json=body, headers={"x-api-key": ALICE_KEY}
    )
    assert response.status_code == 404
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    http = httpx.Client(base_url=server.url)
    assert_still_serving(http)
    http.close()
