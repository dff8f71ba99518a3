"""The reasoning splitter as a streaming state machine: the same text cut into chunks at every
position (tags split anywhere) gives the same reasoning and answer; detection from templates;
the template switches; reasoning before tool calls; stop sequences; the thought grammar."""

from __future__ import annotations

import json
from collections.abc import Iterable

import pytest

from homelab.engine.api import TokenEvent
from homelab.engine.grammar import check_grammar
from homelab.gguf.vocab import CHAT_TEMPLATE, REASONING_CHAT_TEMPLATE
from homelab.server.pieces import ContentDelta, ToolCall
from homelab.server.reasoning import (
    HarmonySplitter,
    Part,
    ReasoningDelta,
    ReasoningFormat,
    Splitter,
    ThinkSplitter,
    after_thought,
    detect_reasoning,
    split_think_text,
    thinking_switches,
)
from homelab.server.replies import ReplyStream, StopSequences, merged_blocks, settled

HARMONY_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
    "{% if reasoning_effort %}Reasoning: {{ reasoning_effort }}{% endif %}"
    "<|start|>assistant<|channel|>final<|message|>"
)


def run(splitter: Splitter, chunks: Iterable[str]) -> tuple[str, str]:
    parts: list[Part] = []
    for chunk in chunks:
        parts += splitter.feed(chunk)
    parts += splitter.finish()
    reasoning = "".join(p.text for p in parts if isinstance(p, ReasoningDelta))
    content = "".join(p.text for p in parts if isinstance(p, ContentDelta))
    assert all(p.text for p in parts), "no empty pieces"
    return reasoning, content


def every_split(text: str) -> Iterable[list[str]]:
    """The text whole, one character at a time, and cut in two at every position."""
    yield [text]
    yield list(text)
    for at in range(1, len(text)):
        yield [text[:at], text[at:]]


THINK_CASES = [
    # (reply, opened by the prompt, reasoning, answer)
    ("<think>\nI weigh it.\n</think>\n\nThe answer.", False, "I weigh it.", "The answer."),
    ("  <think>a < b, so</think>yes", False, "a < b, so", "yes"),
    ("I weigh it.\n</think>\n\nThe answer.", True, "I weigh it.", "The answer."),
    ("No thinking here, just <b>bold</b>.", False, "", "No thinking here, just <b>bold</b>."),
    ("\n<thin", False, "", "\n<thin"),  # not a tag after all
    ("<think>never closed", False, "never closed", ""),
    ("still </thi", True, "still </thi", ""),
    ("</think>", True, "", ""),
    ("<think></think>Only the answer.", False, "", "Only the answer."),
    ("a\n\n</think> multi\nline  ", True, "a", "multi\nline  "),
]


@pytest.mark.parametrize(("reply", "opened", "reasoning", "answer"), THINK_CASES)
def test_think_split_is_the_same_for_any_chunking(
    reply: str, opened: bool, reasoning: str, answer: str
) -> None:
    for chunks in every_split(reply):
        assert run(ThinkSplitter(opened), chunks) == (reasoning, answer), chunks


def test_think_splitter_releases_reasoning_as_it_streams() -> None:
    splitter = ThinkSplitter(opened=True)
    assert splitter.feed("The cache") == [ReasoningDelta("The cache")]
    assert splitter.in_reasoning
    assert splitter.feed(" is warm </") == [ReasoningDelta(" is warm")]  # "</" may be the tag
    assert splitter.feed("think>\n\nYes") == [ContentDelta("Yes")]
    assert not splitter.in_reasoning


HARMONY_REPLY = (
    "<|channel|>analysis<|message|>User wants the weather.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is sunny."
)
HARMONY_CALL = (
    "<|channel|>analysis<|message|>Need the tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Oslo"}'
)


def test_harmony_split_is_the_same_for_any_chunking() -> None:
    for chunks in every_split(HARMONY_REPLY):
        assert run(HarmonySplitter(), chunks) == ("User wants the weather.", "It is sunny."), chunks


def test_harmony_without_end_markers_in_the_text_still_splits() -> None:
    """<|end|> is a control token: with no id to show it, <|start|> still ends the body."""
    reply = HARMONY_REPLY.replace("<|end|>", "")
    assert run(HarmonySplitter(), list(reply)) == ("User wants the weather.", "It is sunny.")


def test_harmony_tool_call_becomes_a_parsed_call() -> None:
    for chunks in ([HARMONY_CALL], list(HARMONY_CALL)):
        stream = ReplyStream(ReasoningFormat("harmony"), parse_tools=True)
        pieces = [p for c in chunks for p in stream.feed(TokenEvent(c, 0))] + stream.finish()
        calls = [p for p in pieces if isinstance(p, ToolCall)]
        assert [(c.name, json.loads(c.arguments_json)) for c in calls] == [
            ("get_weather", {"city": "Oslo"})
        ]
        assert "".join(p.text for p in pieces if isinstance(p, ReasoningDelta)) == "Need the tool."
        assert not [p for p in pieces if isinstance(p, ContentDelta)]


def test_plain_reply_of_a_harmony_model_is_all_content() -> None:
    assert run(HarmonySplitter(), list("Just text <| here")) == ("", "Just text <| here")


def test_control_token_markers_are_seen_through_their_ids() -> None:
    """A vocabulary that renders <|channel|> as empty text: the token id stands for it."""
    markers = {901: "<|channel|>", 902: "<|message|>", 903: "<|start|>", 904: "<|end|>"}
    events = [
        TokenEvent("", 901),
        TokenEvent("analysis", 10),
        TokenEvent("", 902),
        TokenEvent("Hmm.", 11),
        TokenEvent("", 904),
        TokenEvent("", 903),
        TokenEvent("assistant", 12),
        TokenEvent("", 901),
        TokenEvent("final", 13),
        TokenEvent("", 902),
        TokenEvent("Done.", 14),
    ]
    stream = ReplyStream(ReasoningFormat("harmony"), markers=markers)
    pieces = [p for e in events for p in stream.feed(e)] + stream.finish()
    assert [type(p).__name__ for p in pieces] == ["ReasoningDelta", "ContentDelta"]
    assert [p.text for p in pieces if not isinstance(p, ToolCall)] == ["Hmm.", "Done."]
    assert stream.reasoning_tokens == 3  # "<|message|>", "Hmm.", "<|end|>"


def test_tool_call_after_reasoning_is_parsed() -> None:
    call = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    reply = f"<think>Oslo, so the weather tool.</think>\n<tool_call>{call}</tool_call>"
    for chunks in ([reply], list(reply)):
        stream = ReplyStream(ReasoningFormat("think"), parse_tools=True)
        pieces = merged_blocks(
            settled([p for c in chunks for p in stream.feed(TokenEvent(c, 0))] + stream.finish())
        )
        assert [type(p).__name__ for p in pieces] == ["ReasoningDelta", "ToolCall"]
        assert isinstance(pieces[1], ToolCall) and pieces[1].name == "get_weather"


def test_reasoning_tokens_count_the_tokens_inside_the_block() -> None:
    stream = ReplyStream(ReasoningFormat("think"))
    for text in ("<think>", "a", "b", "</think>", "c", "d", "e"):
        stream.feed(TokenEvent(text, 0))
    stream.finish()
    assert stream.reasoning_tokens == 4  # <think> a b </think>


def test_stop_sequences_end_the_answer_and_say_which_matched() -> None:
    reply = "<think>stop here? no</think>The cache END and more"
    for chunks in ([reply], list(reply)):
        stream = ReplyStream(ReasoningFormat("think"), stops=("here", "END", "more"))
        pieces = [p for c in chunks for p in stream.feed(TokenEvent(c, 0))] + stream.finish()
        assert "".join(p.text for p in pieces if isinstance(p, ContentDelta)) == "The cache "
        assert stream.stop_sequence == "END"  # "here" is in the reasoning: not a stop there


def test_stop_sequences_hold_back_only_what_may_become_a_stop() -> None:
    stops = StopSequences(["abc", "xy"])
    assert stops.feed("hello a") == "hello "
    assert stops.feed("b") == ""
    assert stops.feed("d") == "abd"
    assert stops.feed("zx") == "z"
    assert stops.feed("y tail") == "" and stops.matched == "xy"
    assert stops.flush() == ""


@pytest.mark.parametrize(
    ("source", "style"),
    [
        (REASONING_CHAT_TEMPLATE, "think"),
        (HARMONY_TEMPLATE, "harmony"),
        ("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}", None),
        (CHAT_TEMPLATE, None),
        (None, None),
    ],
)
def test_detects_the_format_from_the_template(source: str | None, style: str | None) -> None:
    found = detect_reasoning(source)
    assert (found.style if found else None) == style


def test_opened_by_a_prompt_that_ends_inside_think() -> None:
    think = ReasoningFormat("think")
    assert think.opened_by("<|im_start|>assistant\n<think>\n")
    assert not think.opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not ReasoningFormat("harmony").opened_by("<think>")


def test_thinking_switches_follow_what_the_template_reads() -> None:
    qwen, oss = REASONING_CHAT_TEMPLATE, HARMONY_TEMPLATE
    assert thinking_switches(qwen) == {}
    assert thinking_switches(qwen, default_enable_thinking=False) == {"enable_thinking": False}
    assert thinking_switches(qwen, {"enable_thinking": True}, default_enable_thinking=False) == {
        "enable_thinking": True
    }
    assert thinking_switches(qwen, enable_thinking=True, default_enable_thinking=False) == {
        "enable_thinking": True
    }
    assert thinking_switches(qwen, reasoning_effort="none") == {"enable_thinking": False}
    assert thinking_switches(qwen, reasoning_effort="high") == {}
    assert thinking_switches(oss, reasoning_effort="low") == {"reasoning_effort": "low"}
    assert thinking_switches(oss, enable_thinking=False) == {}  # nothing to switch
    assert thinking_switches(CHAT_TEMPLATE, {"custom": 1}) == {"custom": 1}


def test_after_thought_grammar_is_accepted_by_the_grammar_checks() -> None:
    grammar = after_thought('root ::= "{" [a-z]* "}"')
    check_grammar(grammar)
    assert grammar.startswith("root ::= homelab-thought")
    assert 'homelab-answer ::= "{" [a-z]* "}"' in grammar


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The cache.</think>\n\nYes.", ("The cache.", "Yes.", True)),  # opened by the prompt
        ("<think>Still going", ("Still going", "", False)),
        ("<think>a</think>b", ("a", "b", True)),
        ("plain answer", ("", "plain answer", False)),
    ],
)
def test_split_think_text_for_displays(text: str, expected: tuple[str, str, bool]) -> None:
    assert split_think_text(text) == expected


def test_tui_chat_message_folds_the_thinking() -> None:
    """The TUI's chat turn (homelab/tui/widgets/chat.py): dimmed while thinking, then one line."""
    from homelab.tui.widgets.chat import ChatMessage

    thinking = ChatMessage("assistant", "<think>weighing the cache")
    shown = thinking.shown()
    assert shown.plain == "weighing the cache\n" and "dim" in str(shown.spans[0].style)
    done = ChatMessage("assistant", "weighing the cache</think>\n\nIt is warm.")
    assert done.shown().plain == "▸ thought (3 words)\nIt is warm."
    assert done.answer == "It is warm."  # what the next turn's template gets
    assert ChatMessage("user", "<think> is a tag").shown().plain == "<think> is a tag"
