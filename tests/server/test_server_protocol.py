"""Wire types, error envelopes, metrics text and tool-call parsing, without a server."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from pydantic import ValidationError

from homelab.engine.api import EngineMetrics, RequestStats
from homelab.errors import BusyError, ContextLengthError, EngineError
from homelab.server.errors import api_error_from, param_name
from homelab.server.metrics import ServerMetrics
from homelab.server.pieces import ToolCall
from homelab.server.protocol import (
    IGNORED_LLAMACPP_FIELDS,
    ChatCompletionRequest,
    CompletionRequest,
)
from homelab.server.tools import ContentDelta, ToolCallStream, forced_call_grammar, split_tool_calls
from homelab.server.tools.detect import HERMES, LLAMA3


def chat(**fields: object) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate_json(json.dumps(body))


def test_unions_are_normalized() -> None:
    assert chat(stop="x").stop_strings() == ("x",)
    assert chat(stop=["a", "", "b"]).stop_strings() == ("a", "b")
    assert chat().stop_strings() == ()
    parts = chat(
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
    )
    assert parts.messages[0].text() == "ab"
    assert (
        chat(tool_choice={"type": "function", "function": {"name": "f"}}).tool_choice
        == "function:f"
    )
    prompts = CompletionRequest.model_validate_json(
        '{"model": "m", "prompt": [[1, 2], [3]]}'
    ).prompts()
    assert prompts == [(1, 2), (3,)]


def test_unknown_fields_and_slot_knobs_are_dropped() -> None:
    knobs = {name: 1 for name in IGNORED_LLAMACPP_FIELDS}
    request = chat(**knobs, something={"deep": [1]})
    for model in (ChatCompletionRequest, CompletionRequest):
        assert not set(IGNORED_LLAMACPP_FIELDS) & set(model.model_fields)
    assert not set(IGNORED_LLAMACPP_FIELDS) & set(request.model_dump())


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    assert chat(max_tokens=5, max_completion_tokens=7).requested_max_tokens() == 7
    assert chat(max_tokens=5).requested_max_tokens() == 5


def test_validation_error_names_the_parameter() -> None:
    with pytest.raises(ValidationError) as error:
        chat(messages=[{"role": "user", "content": "x"}, {"role": "tool"}])
    envelope = api_error_from(error.value).envelope()["error"]
    assert envelope["param"] == "messages[1]" and envelope["type"] == "invalid_request_error"
    assert param_name(("tools", 0, "function", "name")) == "tools[0].function.name"


def test_exception_mapping() -> None:
    assert api_error_from(ContextLengthError("too long")).code == "context_length_exceeded"
    assert api_error_from(BusyError("full")).status == 503
    hidden = api_error_from(EngineError("/secret/path failed"))
    assert hidden.status == 500 and "secret" not in hidden.message
    assert api_error_from(ValueError("/etc/passwd")).status == 500


SNAPSHOT = EngineMetrics(
    prefill_tok_s=100.0,
    decode_tok_s=50.0,
    active_slots=1,
    n_slots=4,
    queue_depth=2,
    kv_cells_used=512,
    kv_cells_total=2048,
    requests_total=1,
    requests_by_status={"length": 1},
    last_ttft_s=0.2,
)


def test_metrics_text_has_histogram_and_engine_gauges() -> None:
    metrics = ServerMetrics()
    metrics.observe_response("/v1/chat/completions", 200)
    metrics.observe_generation(RequestStats(10, 4, 5, 0.2, 100.0, 50.0, 0.0))
    text = metrics.render(SNAPSHOT, "tiny")
    assert 'homelab_time_to_first_token_seconds_bucket{model="tiny",le="0.25"} 1' in text
    assert 'homelab_time_to_first_token_seconds_bucket{model="tiny",le="0.1"} 0' in text
    assert 'homelab_time_to_first_token_seconds_count{model="tiny"} 1' in text
    assert 'homelab_kv_usage_ratio{model="tiny"} 0.25' in text
    assert 'homelab_engine_requests_total{model="tiny",status="length"} 1' in text
    assert 'homelab_queue_depth{model="tiny"} 2' in text
    assert "# TYPE homelab_http_responses_total counter" in text


def stream_pieces(text: str, step: int = 1) -> list[object]:
    stream = ToolCallStream()
    pieces: list[object] = []
    for at in range(0, len(text), step):
        pieces += stream.feed(text[at : at + step])
    return pieces + stream.finish()


def test_tagged_tool_calls_stream_out_as_whole_calls() -> None:
    call = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    text = f"Let me check. <tool_call>{call}</tool_call>"
    pieces = stream_pieces(text)
    content = "".join(p.text for p in pieces if isinstance(p, ContentDelta))
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    assert content == "Let me check. " and [c.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].arguments_json) == {"city": "Oslo"}
    assert split_tool_calls(text)[0] == "Let me check."


def test_llama3_json_call_and_plain_text() -> None:
    calls = [
        p
        for p in stream_pieces('{"name": "f", "parameters": {"x": 1}}', 3)
        if isinstance(p, ToolCall)
    ]
    assert [c.name for c in calls] == ["f"]
    plain = stream_pieces("a < b <tool")
    assert "".join(p.text for p in plain if isinstance(p, ContentDelta)) == "a < b <tool"
    assert plain[-1] == ContentDelta("<tool")  # held back until the end: it might have been a call
    assert split_tool_calls("<tool_call>not json</tool_call>") == (
        "<tool_call>not json</tool_call>",
        [],
    )


def test_forced_call_grammar_wraps_the_schema() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
            },
        }
    ]
    grammar = forced_call_grammar(tools, None, HERMES)
    assert (
        grammar.startswith('root ::= ( "<tool_call>\\n{\\"name\\": \\"f\\"')
        and "t0-root ::=" in grammar
    )
    assert forced_call_grammar(tools, "f", LLAMA3).startswith('root ::= ( "{\\"name\\": \\"f\\"')


def test_metrics_show_speculation_only_for_an_engine_that_speculates() -> None:
    plain = SNAPSHOT
    assert "draft" not in ServerMetrics().render(plain, "tiny")
    drafting = replace(
        plain,
        speculation="draft",
        draft_tokens_total=40,
        accepted_draft_tokens_total=30,
        acceptance_rate=0.75,
        tokens_per_target_step=3.5,
    )
    text = ServerMetrics().render(drafting, "tiny")
    assert 'homelab_draft_tokens_total{model="tiny"} 40' in text
    assert 'homelab_accepted_draft_tokens_total{model="tiny"} 30' in text
    assert 'homelab_draft_acceptance_ratio{model="tiny"} 0.75' in text
    assert 'homelab_tokens_per_target_step{model="tiny"} 3.5' in text
