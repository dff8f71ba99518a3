"""``text_events``: a stream's text-only chunks made by splitting the payload once around its
text must be byte for byte what encoding each payload gives (``sse_event``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from homelab.server.streaming import sse_event, text_events

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
