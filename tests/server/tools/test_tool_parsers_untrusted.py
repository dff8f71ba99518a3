"""Model output is untrusted (a tool result can steer it): every tool-call family's stream
parser, fed anything, raises nothing, sends arguments that are strict JSON, and streams
argument fragments that concatenate to the finished call's arguments (issue 39).

The examples are the issue's: Python literals that are no JSON (``{1, 2}``, ``b'x'``,
``...``), non-finite numbers, a repeated parameter, an abandoned call's index, and gpt-oss
calls with the recipient in the role header. The properties run under hypothesis over text
built from each family's own markers, a written call, and hostile fragments.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_tool_formats_hostile import TOOLS, WRITTEN

from homelab.engine.api import TokenEvent
from homelab.server.pieces import ContentDelta, StreamPiece, ToolCall, ToolCallArgs, ToolCallStart
from homelab.server.reasoning import ReasoningFormat
from homelab.server.replies import ReplyStream
from homelab.server.tools import FORMATS, ToolCallStream, ToolFormat, ToolSet, split_tool_calls

EXAMPLES = int(os.environ.get("HOMELAB_HYPOTHESIS_EXAMPLES", "60"))  # more: a deeper run
PER_FAMILY = settings(  # each family's property, run inside its parametrized test
    max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
TYPED = ToolSet.of(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                },
            },
        }
    ]
)


def refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict(text: str) -> Any:
    return json.loads(text, parse_constant=refuse_constant)


def run(tool_format: ToolFormat, chunks: list[str], tools: ToolSet = TOOLS) -> list[StreamPiece]:
    stream = ToolCallStream(tool_format, tools)
    return [p for chunk in chunks for p in stream.feed(chunk)] + stream.finish()


def check_pieces(pieces: list[StreamPiece]) -> None:
    """Strict JSON arguments; each finished call's fragments concatenate to its arguments;
    no call index is started twice."""
    starts = [p.index for p in pieces if isinstance(p, ToolCallStart)]
    assert len(starts) == len(set(starts)), f"an index was reused: {starts}"
    fragments: dict[int, str] = {}
    ids: dict[str, int] = {}
    for piece in pieces:
        if isinstance(piece, ToolCallStart):
            fragments[piece.index], ids[piece.id] = "", piece.index
        elif isinstance(piece, ToolCallArgs):
            fragments[piece.index] += piece.fragment
        elif isinstance(piece, ToolCall):
            final = strict(piece.arguments_json)
            assert isinstance(final, dict)
            assert strict(fragments[ids[piece.id]]) == final, "streamed != final arguments"


# --- the examples ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("qwen3-coder", "<tool_call>\n<function=get_weather>\n<parameter=days>\n{1, 2}\n"
         "</parameter>\n</function>\n</tool_call>"),
        ("glm", "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>b'x'</arg_value>\n"
         "</tool_call>"),
        ("glm", "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>NaN</arg_value>\n"
         "</tool_call>"),
        ("glm", "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>1e999</arg_value>\n"
         "</tool_call>"),
    ],
)  # fmt: skip
def test_a_literal_that_is_no_json_stays_text(name: str, text: str) -> None:
    pieces = run(FORMATS[name], [text], TYPED)
    check_pieces(pieces)
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    assert len(calls) == 1
    assert isinstance(strict(calls[0].arguments_json)["days"], str)  # the text, as written


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("lfm2", "<|tool_call_start|>[get_weather(city=...)]<|tool_call_end|>"),
        ("lfm2", "<|tool_call_start|>[get_weather(city={1, 2})]<|tool_call_end|>"),
        ("lfm2", "<|tool_call_start|>[get_weather(city=1e999)]<|tool_call_end|>"),
        ("lfm2", "<|tool_call_start|>[get_weather(city=b'x')]<|tool_call_end|>"),
        ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": NaN}}</tool_call>'),
        ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"c": 1e999}}</tool_call>'),
        ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"c": Infinity}}</tool_call>'),
        ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": -Infinity}'),
        ("gemma4", "<|tool_call>call:get_weather{city:NaN}<tool_call|>"),
    ],
)
def test_arguments_that_are_no_json_are_not_a_call(name: str, text: str) -> None:
    for chunks in ([text], list(text)):
        pieces = run(FORMATS[name], chunks)
        check_pieces(pieces)
        assert not [p for p in pieces if isinstance(p, ToolCall)], chunks


def test_a_repeated_parameter_streams_what_the_call_says() -> None:
    text = (
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n"
        "<arg_key>city</arg_key>\n<arg_value>Bergen</arg_value>\n</tool_call>"
    )
    for chunks in ([text], list(text)):
        pieces = run(FORMATS["glm"], chunks)
        check_pieces(pieces)
        calls = [p for p in pieces if isinstance(p, ToolCall)]
        assert [strict(c.arguments_json) for c in calls] == [{"city": "Bergen"}]


def test_an_abandoned_call_spends_its_index() -> None:
    broken = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo" ]}</tool_call>'
    good = WRITTEN["hermes"]
    pieces = run(FORMATS["hermes"], list(broken + " then " + good))
    check_pieces(pieces)
    starts = [p.index for p in pieces if isinstance(p, ToolCallStart)]
    assert starts == [0, 1]
    assert [p.name for p in pieces if isinstance(p, ToolCall)] == ["get_weather"]


GPT_OSS_CALL = (
    ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>'
)


@pytest.mark.parametrize("chunking", ["whole", "by-character"])
def test_a_gpt_oss_call_with_the_recipient_in_the_role_header_is_a_call(chunking: str) -> None:
    chunks = [GPT_OSS_CALL] if chunking == "whole" else list(GPT_OSS_CALL)
    stream = ReplyStream(ReasoningFormat("harmony"), parse_tools=True)
    pieces = [p for c in chunks for p in stream.feed(TokenEvent(c, 0))] + stream.finish()
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    assert [(c.name, strict(c.arguments_json)) for c in calls] == [
        ("get_weather", {"city": "Oslo"})
    ]
    assert not "".join(p.text for p in pieces if isinstance(p, ContentDelta)).strip()


def test_a_gpt_oss_reply_starting_with_to_stays_text() -> None:
    stream = ReplyStream(ReasoningFormat("harmony"), parse_tools=True)
    reply = "to=be or not to be"
    pieces = [p for c in reply for p in stream.feed(TokenEvent(c, 0))] + stream.finish()
    assert "".join(p.text for p in pieces if isinstance(p, ContentDelta)) == reply


# --- properties over any text -------------------------------------------------------------------

HOSTILE = (
    "{", "}", "[", "]", '"', ":", ",", " ", "\n", "\\", "NaN", "Infinity", "1e999", "-0", "1.5",
    "{1, 2}", "b'x'", "...", "1j", "True", "None", "null", '"city"', '"name"', '"arguments"',
    "get_weather", "city", "nope", "Oslo", "(", ")", "=", "'", "é", "\x00", "\ud7ff",
)  # fmt: skip


def markers_of(tool_format: ToolFormat) -> set[str]:
    """Every marker a format's fields name (nested formats' too)."""
    found: set[str] = set(tool_format.markers())
    fields = vars(tool_format).values()
    for value in fields:
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            if isinstance(item, str) and 1 < len(item) < 40:
                found.add(item)
            elif isinstance(item, tuple):
                found |= {i for i in item if isinstance(i, str) and i}
            elif isinstance(item, ToolFormat):
                found |= markers_of(item)
    if dataclasses.is_dataclass(tool_format):
        found.discard(tool_format.name)
    return found


def texts_for(name: str) -> st.SearchStrategy[list[str]]:
    """Chunks of a reply: the family's markers, its written call cut anywhere, hostile bits."""
    written = WRITTEN[name]
    atoms = sorted(markers_of(FORMATS[name])) + list(HOSTILE)
    cuts = st.integers(0, len(written)).map(lambda at: written[:at])
    pieces = st.one_of(st.sampled_from(atoms), st.just(written), cuts, st.text(max_size=6))
    return st.lists(pieces, max_size=12)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_any_text_streams_strict_json_that_matches_the_call(name: str) -> None:
    @PER_FAMILY
    @given(chunks=texts_for(name), split=st.booleans())
    def property_holds(chunks: list[str], split: bool) -> None:
        text = "".join(chunks)
        for tools in (TOOLS, TYPED):
            pieces = run(FORMATS[name], list(text) if split else chunks, tools)
            check_pieces(pieces)
            shown = "".join(p.text if isinstance(p, ContentDelta) else "" for p in pieces)
            assert len(shown) <= len(text)  # nothing the model did not write

    property_holds()


def calls_of(pieces: list[StreamPiece]) -> list[tuple[str, Any]]:
    return [(p.name, strict(p.arguments_json)) for p in pieces if isinstance(p, ToolCall)]


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_the_whole_reply_parses_to_the_calls_its_stream_made(name: str) -> None:
    """A finished message (``split_tool_calls``, what a non-streamed answer returns) holds
    the calls its stream sent, however the text arrived."""

    @PER_FAMILY
    @given(chunks=texts_for(name), split=st.booleans())
    def property_holds(chunks: list[str], split: bool) -> None:
        text = "".join(chunks)
        for tools in (TOOLS, TYPED):
            streamed = run(FORMATS[name], list(text) if split else chunks, tools)
            _, whole = split_tool_calls(text, FORMATS[name], tools)
            assert calls_of(streamed) == calls_of(whole)

    property_holds()


HARMONY_ATOMS = (
    "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>",
    "assistant", "analysis", "commentary", "final", " to=functions.get_weather",
    " to=functions.", " to=", "to=", " json", "<|constrain|>json", "functions.get_weather",
)  # fmt: skip


@settings(max_examples=4 * EXAMPLES, deadline=None, database=None)
@given(
    chunks=st.lists(
        st.one_of(
            st.sampled_from(HARMONY_ATOMS + HOSTILE),
            st.just(GPT_OSS_CALL),
            st.integers(0, len(GPT_OSS_CALL)).map(lambda at: GPT_OSS_CALL[:at]),
            st.text(max_size=6),
        ),
        max_size=14,
    ),
    split=st.booleans(),
)
def test_any_harmony_reply_streams_strict_json_that_matches_the_call(
    chunks: list[str], split: bool
) -> None:
    """gpt-oss: its channels split by the harmony splitter, calls (recipient in the role
    header or after the channel) parsed as the gpt-oss family."""
    text = "".join(chunks)
    stream = ReplyStream(
        ReasoningFormat("harmony"), parse_tools=True, tool_format=FORMATS["gpt-oss"]
    )
    pieces = [p for c in (list(text) if split else chunks) for p in stream.feed(TokenEvent(c, 0))]
    check_pieces(pieces + stream.finish())
