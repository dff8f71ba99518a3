"""Hostile model output for every tool-call format: unclosed markers, broken JSON, tools
that were not offered, absurd nesting, markers split at every boundary. The parser answers
with content or calls the model really wrote — never a crash, a hang or an invented call."""

from __future__ import annotations

import time

import pytest

from homelab.server.pieces import ContentDelta, StreamPiece, ToolCall
from homelab.server.tools import FORMATS, ToolCallStream, ToolFormat, ToolSet, split_tool_calls

TOOLS = ToolSet.of(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
)
# One call to get_weather(city="Oslo") as each format writes it.
WRITTEN = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    "llama3": '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
    "generic": '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>',
    "gpt-oss": '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
    "qwen3-coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
    "</function>\n</tool_call>",
    "seed-oss": "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Oslo</parameter>\n"
    "</function>\n</seed:tool_call>",
    "glm": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n"
    "</tool_call>",
    "hunyuan": "<tool_calls:opensource><tool_call:opensource>get_weather<tool_sep:opensource>"
    "<arg_key:opensource>city</arg_key:opensource><arg_value:opensource>Oslo"
    "</arg_value:opensource></tool_call:opensource></tool_calls:opensource>",
    "minimax-m2": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">'
    "Oslo</parameter>\n</invoke>\n</minimax:tool_call>",
    "deepseek-v3.2": '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
    "deepseek-v4": '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
    "minicpm": '<function name="get_weather"><param name="city">Oslo</param></function>',
    "kimi-k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|>',
    "solar": "<|tool_calls|><|tool_call:begin|>c1<|tool_call:name|>get_weather"
    '<|tool_call:args|>{"city": "Oslo"}<|tool_call:end|>',
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}',
    "functionary-v3.1": '<function=get_weather>{"city": "Oslo"}</function>',
    "command-r": '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", '
    '"parameters": {"city": "Oslo"}}]<|END_ACTION|>',
    "apertus": '<|tools_prefix|>[{"get_weather": {"city": "Oslo"}}]<|tools_suffix|>',
    "nemotron-v2": '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]</TOOLCALL>',
    "apriel": '<tool_calls>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]</tool_calls>',
    "gigachat": '<|function_call|>{"name": "get_weather", "arguments": {"city": "Oslo"}}',
    "granite": '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
    "lfm2": "<|tool_call_start|>[get_weather(city='Oslo')]<|tool_call_end|>",
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>}<tool_call|>',
}
FORMAT_NAMES = sorted(FORMATS)


def _run(tool_format: ToolFormat, chunks: list[str], tools: ToolSet = TOOLS) -> list[StreamPiece]:
    stream = ToolCallStream(tool_format, tools)
    return [p for chunk in chunks for p in stream.feed(chunk)] + stream.finish()


def _split(
    tool_format: ToolFormat, text: str, tools: ToolSet = TOOLS
) -> tuple[str, list[ToolCall]]:
    return split_tool_calls(text, tool_format, tools)


def test_every_format_has_a_written_call() -> None:
    assert set(WRITTEN) == set(FORMATS)


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_the_written_call_parses(name: str) -> None:
    content, calls = _split(FORMATS[name], "Sure. " + WRITTEN[name] if name not in (
        "llama3", "gpt-oss") else WRITTEN[name])  # fmt: skip
    assert [(c.name, c.arguments_json) for c in calls] == [("get_weather", '{"city": "Oslo"}')]
    assert content in ("Sure.", "")


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_split_at_every_boundary_gives_the_same_call(name: str) -> None:
    text = WRITTEN[name]
    for at in range(1, len(text)):
        for second in (at + 1, len(text)):
            pieces = _run(FORMATS[name], [text[:at], text[at:second], text[second:]])
            calls = [p for p in pieces if isinstance(p, ToolCall)]
            assert [(c.name, c.arguments_json) for c in calls] == [
                ("get_weather", '{"city": "Oslo"}')
            ], (at, second)
            assert not [p for p in pieces if isinstance(p, ContentDelta) and p.text.strip()]


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_an_unclosed_call_is_content(name: str) -> None:
    text = WRITTEN[name]
    for cut in sorted({len(text) // 3, len(text) // 2, len(text) - 1}):
        if name in ("mistral", "llama3", "gpt-oss", "gigachat", "granite") and cut == len(text) - 1:
            continue  # these end with the JSON itself: one character short is broken JSON
        content, calls = _split(FORMATS[name], text[:cut])
        assert calls == [] and content == text[:cut], cut


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_a_tool_that_was_not_offered_is_not_called(name: str) -> None:
    text = WRITTEN[name].replace("get_weather", "rm_rf")
    content, calls = _split(FORMATS[name], text)
    assert calls == [] and content == text


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_broken_json_is_content(name: str) -> None:
    text = WRITTEN[name].replace('{"city": "Oslo"}', '{"city": Oslo}')
    if text == WRITTEN[name]:
        text = WRITTEN[name].replace("city", "ci<ty")  # tagged formats: broken markup
    content, calls = _split(FORMATS[name], text)
    assert calls == [] or all(c.name == "get_weather" for c in calls)
    if not calls:
        assert content == text


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_ten_thousand_nested_brackets_end_quickly_without_a_call(name: str) -> None:
    nested = "[" * 10_000 + "]" * 10_000
    text = WRITTEN[name].replace('"Oslo"', nested).replace("Oslo", nested)
    started = time.monotonic()
    stream = ToolCallStream(FORMATS[name], TOOLS)
    pieces = [p for i in range(0, len(text), 3) for p in stream.feed(text[i : i + 3])]
    pieces += stream.finish()
    assert time.monotonic() - started < 5
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    assert all(c.name == "get_weather" for c in calls)  # a raw-text argument may hold it
    content = "".join(p.text for p in pieces if isinstance(p, ContentDelta))
    assert calls or content == text


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_plain_text_is_held_back_no_longer_than_a_marker_prefix(name: str) -> None:
    tool_format = FORMATS[name]
    text = "Plain < text [ with <| near | misses <tool and {braces} ｜ done."
    stream = ToolCallStream(tool_format, TOOLS)
    released = ""
    for at, char in enumerate(text):
        released += "".join(p.text for p in stream.feed(char) if isinstance(p, ContentDelta))
        held = text[: at + 1][len(released) :]
        if held:  # whatever is held could still become a marker
            assert any(m.startswith(held) for m in tool_format.openers), (held, at)
    released += "".join(p.text for p in stream.finish() if isinstance(p, ContentDelta))
    assert released == text


def test_a_call_inside_reasoning_is_not_a_call() -> None:
    from homelab.engine.api import TokenEvent
    from homelab.server.reasoning import ReasoningFormat
    from homelab.server.replies import ReplyStream

    stream = ReplyStream(ReasoningFormat("think"), parse_tools=True, tools=TOOLS)
    text = f"<think>maybe {WRITTEN['hermes']}?</think>No call needed."
    pieces = [p for char in text for p in stream.feed(TokenEvent(char, 0))] + stream.finish()
    assert not [p for p in pieces if isinstance(p, ToolCall)]


def test_a_json_answer_is_released_once_its_first_key_shows_it_is_not_a_call() -> None:
    stream = ToolCallStream(FORMATS["generic"], TOOLS)
    answer = '{"answer": 42, "more": "text"}'
    released = [p for char in answer[:12] for p in stream.feed(char)]
    assert "".join(p.text for p in released if isinstance(p, ContentDelta)) == answer[:12]
    rest = [p for char in answer[12:] for p in stream.feed(char)] + stream.finish()
    assert not [p for p in rest if isinstance(p, ToolCall)]
