"""``POST /v1/responses`` with the official ``openai`` SDK, unmodified, against the session's
real server (tiny demo llama): plain, streamed, function tools, json_schema, and what a
server refuses."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel
from server_helpers import MODEL_ID

ASK = "what is the weather in Oslo?"
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "current weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]}},
        "required": ["city"],
    },
}
CLOCK: Any = {"type": "function", "name": "get_time", "parameters": {"type": "object"}}
CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Oslo", "Paris"]},
        "days": {"type": "integer"},  # minimum/maximum: llama-cpp-python's converter drops them
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def test_plain_response_shape_and_usage(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL_ID, input="hello there", max_output_tokens=8, temperature=0
    )
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete") and response.model == MODEL_ID
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text"
    assert response.output_text == message.content[0].text
    usage = response.usage
    assert usage is not None and 1 <= usage.output_tokens <= 8 and usage.input_tokens > 1
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    if response.status == "incomplete":
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"


def test_same_path_as_chat_greedy_output_is_identical(client: openai.OpenAI) -> None:
    """Instructions + items render to the same prompt as the system + user chat messages."""
    response = client.responses.create(
        model=MODEL_ID,
        instructions="You are terse.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "tell me a cache"}]}],
        max_output_tokens=12,
        temperature=0,
    )
    chat = client.chat.completions.create(
        model=MODEL_ID,
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "tell me a cache"},
        ],
        max_tokens=12,
        temperature=0,
    )
    assert response.output_text == chat.choices[0].message.content
    assert response.usage is not None and chat.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens


def test_streamed_events_come_in_order_and_assemble_the_text(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model=MODEL_ID, input="hello there", max_output_tokens=10, temperature=0, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    collapsed = [k for i, k in enumerate(kinds[:-1]) if i == 0 or k != kinds[i - 1]]
    assert collapsed == TEXT_EVENTS
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response  # type: ignore[union-attr]
    assert deltas == done.text == final.output_text
    assert final.usage is not None and final.usage.output_tokens >= 1
    plain = client.responses.create(
        model=MODEL_ID, input="hello there", max_output_tokens=10, temperature=0
    )
    assert plain.output_text == deltas  # greedy: streamed and not agree


def test_the_sdk_stream_helper_accepts_the_event_sequence(client: openai.OpenAI) -> None:
    """The SDK's own accumulator checks item identities and indexes strictly (and wants a
    completed response: a grammar that closes makes the model stop on its own)."""
    trip = {"format": {"type": "json_schema", "name": "trip", "schema": CITY_SCHEMA}}
    with client.responses.stream(
        model=MODEL_ID, input="plan a trip", text=trip, max_output_tokens=96, temperature=0
    ) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == "".join(texts)
    with client.responses.stream(
        model=MODEL_ID, input=ASK, tools=[WEATHER], tool_choice="required", max_output_tokens=128
    ) as stream:
        final = stream.get_final_response()
    assert [item.type for item in final.output][-1] == "function_call"


def test_forced_function_call(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL_ID,
        input=ASK,
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=128,
        temperature=0,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and response.status == "completed"
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments)["city"] in ("Oslo", "Paris")


def test_named_tool_choice_and_a_streamed_call(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model=MODEL_ID,
            input=ASK,
            tools=[WEATHER, CLOCK],
            tool_choice={"type": "function", "name": "get_time"},
            max_output_tokens=64,
            temperature=0,
            stream=True,
        )
    )
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].name == "get_time"
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(deltas) == done[0].arguments and isinstance(json.loads(done[0].arguments), dict)
    final = events[-1].response  # type: ignore[union-attr]
    assert [item.type for item in final.output if item.type == "function_call"] == ["function_call"]


def test_function_call_output_round_trip(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL_ID, input=ASK, tools=[WEATHER], tool_choice="required", max_output_tokens=128
    )
    call = next(item for item in first.output if item.type == "function_call")
    history: list[Any] = [
        {"role": "user", "content": ASK},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 4}'},
    ]
    second = client.responses.create(
        model=MODEL_ID, input=history, tools=[WEATHER], max_output_tokens=8, temperature=0
    )
    assert second.status in ("completed", "incomplete") and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # type: ignore[union-attr]


def test_json_schema_output_parses_and_validates(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL_ID,
        input="plan a trip",
        text={"format": {"type": "json_schema", "name": "trip", "schema": CITY_SCHEMA}},
        max_output_tokens=96,
        temperature=0,
    )
    jsonschema.validate(json.loads(response.output_text), CITY_SCHEMA)


class Trip(BaseModel):
    city: Literal["Oslo", "Paris"]
    days: int


def test_sdk_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(
        model=MODEL_ID, input="plan a trip", text_format=Trip, max_output_tokens=96, temperature=0
    )
    assert isinstance(parsed.output_parsed, Trip)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
    ],
)
def test_stateful_features_are_refused_clearly(
    client: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError, match="not supported") as raised:
        client.responses.create(model=MODEL_ID, input="hi", max_output_tokens=2, **fields)
    assert raised.value.param == param
    assert client.responses.create(model=MODEL_ID, input="hi", max_output_tokens=2, store=False)
