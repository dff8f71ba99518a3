"""A finished assistant message -> content + tool calls (the JSON forms), split by the stream
parser the server runs (split_tool_calls feeds it the whole text at once)."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError

import pytest

from homelab.server.pieces import ToolCall
from homelab.server.tools import split_tool_calls


def test_qwen_style_tool_call_with_content_before_it() -> None:
    call_json = '{"name": "get_weather", "arguments": {"city": "Zürich"}}'
    text = f"Let me check.\n<tool_call>\n{call_json}\n</tool_call>"
    content, calls = split_tool_calls(text)
    assert content == "Let me check."
    assert [(call.name, json.loads(call.arguments_json)) for call in calls] == [
        ("get_weather", {"city": "Zürich"})
    ]
    assert "Zürich" in calls[0].arguments_json  # not \\u-escaped
    assert calls[0].id.startswith("call_")


def test_several_tagged_calls_get_distinct_ids() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": "{\\"x\\": 1}"}</tool_call>'
    )
    content, calls = split_tool_calls(text)
    assert content == ""
    assert [(call.name, call.arguments_json) for call in calls] == [("a", "{}"), ("b", '{"x": 1}')]
    assert calls[0].id != calls[1].id


def test_malformed_json_inside_tags_stays_content() -> None:
    text = 'I will call <tool_call>{"name": "a", "arguments": {</tool_call>'
    assert split_tool_calls(text) == (text, [])


def test_malformed_block_next_to_a_good_one_stays_in_the_content() -> None:
    text = '<tool_call>not json</tool_call><tool_call>{"name": "ok", "arguments": {}}</tool_call>'
    content, calls = split_tool_calls(text)
    assert content == "<tool_call>not json</tool_call>"
    assert [call.name for call in calls] == ["ok"]


def test_unclosed_tool_call_stays_content() -> None:
    text = '<tool_call>{"name": "a", "arguments": {}}'
    assert split_tool_calls(text) == (text, [])


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
        '  <|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}\n',
    ],
    ids=["bare-json", "python-tag"],
)
def test_llama3_json_tool_call(text: str) -> None:
    content, calls = split_tool_calls(text)
    assert content == ""
    assert [(call.name, json.loads(call.arguments_json)) for call in calls] == [
        ("get_weather", {"city": "Oslo"})
    ]


def test_llama3_semicolon_separated_calls() -> None:
    text = '{"name": "a", "parameters": {"n": 1}}; {"name": "b", "parameters": {"n": 2}}'
    assert [call.name for call in split_tool_calls(text)[1]] == ["a", "b"]


@pytest.mark.parametrize(
    "text",
    [
        "Just an answer.",
        '{"answer": 42}',
        '{"name": "a", "parameters": [1, 2]}',
        '{"name": "a", "parameters": {}} and then some words',
        "<|python_tag|>print('hello')",
        '{"name": "", "parameters": {}}',
    ],
)
def test_text_that_is_not_a_tool_call_is_left_alone(text: str) -> None:
    assert split_tool_calls(text) == (text, [])


def test_tool_call_is_frozen() -> None:
    call = ToolCall(id="call_1", name="a", arguments_json="{}")
    with pytest.raises(FrozenInstanceError):
        call.name = "b"  # type: ignore[misc]
