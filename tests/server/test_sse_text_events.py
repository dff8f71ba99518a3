"""``text_events`` and ``numbered_text_events``: a stream's text-only chunks made by splitting
the payload once around its text (and running number) must be byte for byte what encoding each
payload gives (``sse_event``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from homelab.server.streaming import numbered_text_events, sse_event, text_events

TEXTS = [
    "",
    "hello",
    ' "quoted" \\ back\\slash',
    "line\nbreak\ttab\r\x00\x1f\x7f",
    "ünïcödé — 漢字 🙂",
    "</script>",
    "\u2028\u2029",
]


def completion_payload(model: str, text: str) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
    return {"id": "cmpl-1", "object": "text_completion", "model": model, "choices": [choice]}


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("name", [None, "content_block_delta"])
def test_the_same_bytes_as_encoding_the_payload(text: str, name: str | None) -> None:
    event = text_events(lambda t: completion_payload("tiny", t), name)
    assert event(text) == sse_event(completion_payload("tiny", text), name)
    data = event(text).split(b"data: ", 1)[1]
    assert json.loads(data)["choices"][0]["text"] == text


def test_a_payload_holding_the_mark_elsewhere_is_encoded_whole() -> None:
    """The split needs the mark exactly once: a model named with it (however unlikely) gets
    the plain encoding, still the right bytes."""
    model = "\ue000homelab text\ue000"
    event = text_events(lambda t: completion_payload(model, t))
    for text in ("a", "b c"):
        assert event(text) == sse_event(completion_payload(model, text))


def delta_payload(number: object, text: str) -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "sequence_number": number,
        "item_id": "msg_1",
        "delta": text,
        "logprobs": [],
    }


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("number", [0, 7, 123456789])
def test_a_numbered_event_is_the_same_bytes_too(text: str, number: int) -> None:
    event = numbered_text_events(delta_payload, "response.output_text.delta")
    expected = sse_event(delta_payload(number, text), "response.output_text.delta")
    assert event(number, text) == expected


def test_a_numbered_payload_without_its_marks_in_order_is_encoded_whole() -> None:
    def text_first(number: object, text: str) -> dict[str, Any]:
        return {"delta": text, "sequence_number": number}

    event = numbered_text_events(text_first)
    assert event(3, "a") == sse_event({"delta": "a", "sequence_number": 3})
