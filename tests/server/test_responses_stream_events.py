"""The Responses stream's output items: the text of the open item, joined once."""

from __future__ import annotations

import json

from homelab.server.responses_stream import _Events


def event_payloads(chunks: list[bytes]) -> list[dict[str, object]]:
    return [json.loads(chunk.split(b"data: ", 1)[1]) for chunk in chunks]


def test_the_open_item_has_its_text_so_far_and_closes_with_all_of_it() -> None:
    events = _Events()
    deltas = ["Hel", "lo, ", "wörld", ""]
    chunks = [chunk for delta in deltas for chunk in events.text("message", delta)]
    sent = [p for p in event_payloads(chunks) if p["type"] == "response.output_text.delta"]
    assert [p["delta"] for p in sent] == deltas
    assert [p["sequence_number"] for p in event_payloads(chunks)] == list(range(len(chunks)))
    # an error now (response.failed) reports the open message with what it has so far
    assert events.current_items()[0]["content"][0]["text"] == "Hello, wörld"
    events.text("message", "!")
    done = {p["type"]: p for p in event_payloads(events.finish())}
    assert done["response.output_text.done"]["text"] == "Hello, wörld!"
    assert events.items[0]["content"][0]["text"] == "Hello, wörld!"
    assert events.items[0]["status"] == "completed"


def test_a_reasoning_item_then_a_message_each_keep_their_own_text() -> None:
    events = _Events()
    events.text("reasoning", "think ")
    events.text("reasoning", "hard")
    events.text("message", "answer")
    events.finish()
    reasoning, message = events.items
    assert reasoning["type"] == "reasoning" and message["type"] == "message"
    assert reasoning["content"][0]["text"] == "think hard"
    assert message["content"][0]["text"] == "answer"
