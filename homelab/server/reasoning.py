"""Reasoning ("thinking") output: which format a model uses, and a streaming splitter that
separates the reasoning from the answer.

Two formats are recognised from the chat template:

``think``
    ``<think>…</think>`` before the answer (Qwen3, DeepSeek-R1 and its distills, GLM, QwQ…).
    Some templates open the block in the prompt (``…assistant\\n<think>\\n``): the output
    then starts inside the reasoning (``opened``). Otherwise the reasoning is whatever the
    reply opens with ``<think>``.
``harmony``
    gpt-oss's channels: ``<|channel|>analysis<|message|>…<|end|>`` is reasoning,
    ``<|start|>assistant<|channel|>final<|message|>…`` the answer, and
    ``<|channel|>commentary to=functions.NAME … <|message|>{json}<|call|>`` a tool call,
    handed on as a ``<tool_call>`` block so the one tool-call parser reads it.

A splitter is fed text as it arrives, in chunks of any size (a tag may be split across
chunks), and returns :class:`~homelab.server.pieces.ReasoningDelta` and
:class:`~homelab.server.pieces.ContentDelta`
pieces; it holds back only what could still become a tag (and whitespace at the edges of
the reasoning, which is trimmed). :func:`thinking_switches` turns the request's knobs
(``enable_thinking``, ``reasoning_effort``) into template variables the template reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from homelab.server.pieces import ContentDelta, ReasoningDelta

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
H_START, H_CHANNEL, H_MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
H_END, H_CALL, H_RETURN, H_CONSTRAIN = "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"
HARMONY_MARKERS = (H_START, H_CHANNEL, H_MESSAGE, H_END, H_CALL, H_RETURN, H_CONSTRAIN)
_BODY_ENDS = (H_END, H_START, H_CHANNEL, H_CALL, H_RETURN)
_ENABLE_THINKING = re.compile(r"\benable_thinking\b")
_REASONING_EFFORT = re.compile(r"\breasoning_effort\b")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
# a reply opens with a channel, a new message, or (as the template renders a call) the
# recipient of its role header: `` to=functions.NAME<|channel|>commentary json<|message|>``
_HEADER_STARTS = (H_CHANNEL, H_START, "to=")
THOUGHT_RULE = "homelab-thought"
ANSWER_RULE = "homelab-answer"

Style = Literal["think", "harmony"]


Part = ReasoningDelta | ContentDelta


@dataclass(frozen=True)
class ReasoningFormat:
    """How a model's template marks reasoning."""

    style: Style

    @property
    def markers(self) -> tuple[str, ...]:
        """The tags of this format (some vocabularies render them as empty control tokens)."""
        return (THINK_OPEN, THINK_CLOSE) if self.style == "think" else HARMONY_MARKERS

    def opened_by(self, prompt: str) -> bool:
        """Whether the prompt leaves a reasoning block open, so the reply starts inside it."""
        return self.style == "think" and prompt.rstrip().endswith(THINK_OPEN)

    def splitter(self, opened: bool = False) -> Splitter:
        return ThinkSplitter(opened) if self.style == "think" else HarmonySplitter()


def detect_reasoning(template_source: str | None) -> ReasoningFormat | None:
    """The reasoning format a chat template shows, or None for a model that does not reason."""
    source = template_source or ""
    if H_CHANNEL in source and H_MESSAGE in source:
        return ReasoningFormat("harmony")
    if THINK_OPEN in source or THINK_CLOSE in source:
        return ReasoningFormat("think")
    return None


def thinking_switches(
    template_source: str,
    requested: Mapping[str, Any] | None = None,
    *,
    enable_thinking: bool | None = None,
    reasoning_effort: str | None = None,
    default_enable_thinking: bool | None = None,
) -> dict[str, Any]:
    """Template variables for this request: ``requested`` (``chat_template_kwargs``) first,
    then ``enable_thinking`` and ``reasoning_effort`` where the template reads them.

    ``reasoning_effort`` "none" turns thinking off on a template that has only the
    ``enable_thinking`` switch; other efforts there change nothing (the template cannot
    express them). The server's default applies only when the request says nothing.
    """
    switches = dict(requested or {})
    reads_switch = bool(_ENABLE_THINKING.search(template_source))
    if _REASONING_EFFORT.search(template_source) and reasoning_effort is not None:
        switches.setdefault("reasoning_effort", reasoning_effort)
    if not reads_switch:
        return switches
    if enable_thinking is None and reasoning_effort == "none":
        enable_thinking = False
    if enable_thinking is None:
        enable_thinking = default_enable_thinking
    if enable_thinking is not None:
        switches.setdefault("enable_thinking", enable_thinking)
    return switches


def after_thought(grammar: str) -> str:
    """``grammar`` for a reply that starts inside an open ``<think>`` block: any thought
    (without ``</``), the closing tag, then what ``grammar`` accepts."""
    answer = re.sub(r"^root\s*::=", f"{ANSWER_RULE} ::=", grammar.strip(), flags=re.M)
    return (
        f'root ::= {THOUGHT_RULE} "{THINK_CLOSE}" [ \\t\\n]* {ANSWER_RULE}\n'
        f'{THOUGHT_RULE} ::= ([^<] | "<" [^/])*\n{answer}\n'
    )


def split_think_text(text: str) -> tuple[str, str, bool]:
    """(reasoning, answer, whether the reasoning has ended) of a whole ``<think>`` reply, for
    displays that see only the text: a ``</think>`` without an opening tag means the prompt
    opened the block."""
    opened = THINK_CLOSE in text and not text.lstrip().startswith(THINK_OPEN)
    splitter = ThinkSplitter(opened)
    parts = splitter.feed(text) + splitter.finish()
    reasoning = "".join(p.text for p in parts if isinstance(p, ReasoningDelta))
    answer = "".join(p.text for p in parts if isinstance(p, ContentDelta))
    return reasoning, answer, THINK_CLOSE in text


class Splitter(Protocol):
    @property
    def in_reasoning(self) -> bool: ...
    def feed(self, text: str) -> list[Part]: ...
    def finish(self) -> list[Part]: ...


def _partial_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that is the start of one of ``tags``."""
    longest = min(len(text), max(len(tag) for tag in tags) - 1)
    for length in range(longest, 0, -1):
        end = text[-length:]
        if any(tag.startswith(end) for tag in tags):
            return length
    return 0


class ThinkSplitter:
    """``[<think>] reasoning </think> answer``, the reasoning and the answer trimmed."""

    def __init__(self, opened: bool = False) -> None:
        self._state = "reasoning" if opened else "start"
        self._buffer = ""
        self._lead = True  # whitespace at the start of the current part is dropped

    @property
    def in_reasoning(self) -> bool:
        return self._state == "reasoning"

    def feed(self, text: str) -> list[Part]:
        self._buffer += text
        parts: list[Part] = []
        while True:
            if self._state == "start" and not self._choose():
                break
            if self._state == "reasoning":
                if not self._reason(parts):
                    break
            elif self._state == "content":
                self._answer(parts)
                break
        return parts

    def finish(self) -> list[Part]:
        buffer, self._buffer = self._buffer, ""
        if self._state == "reasoning":
            text = buffer.strip() if self._lead else buffer.rstrip()
            return [ReasoningDelta(text)] if text else []
        text = buffer.lstrip() if self._lead and self._state == "content" else buffer
        return [ContentDelta(text)] if text else []

    def _choose(self) -> bool:
        """In "start": decide whether the reply opens a think block (False: need more text)."""
        head = self._buffer.lstrip()
        if head.startswith(THINK_OPEN):
            self._state, self._buffer, self._lead = "reasoning", head[len(THINK_OPEN) :], True
        elif not head or THINK_OPEN.startswith(head):
            return False
        else:
            self._state, self._lead = "content", False
        return True

    def _reason(self, parts: list[Part]) -> bool:
        """Release reasoning; True when the block closed (the rest is the answer)."""
        at = self._buffer.find(THINK_CLOSE)
        if at >= 0:
            self._release(self._buffer[:at].rstrip(), parts)
            self._buffer = self._buffer[at + len(THINK_CLOSE) :]
            self._state, self._lead = "content", True
            return True
        keep = _partial_suffix(self._buffer, (THINK_CLOSE,))
        cut = len(self._buffer) - keep
        ready = self._buffer[:cut].rstrip()  # trailing whitespace may precede </think>
        self._buffer = self._buffer[len(ready) :]
        self._release(ready, parts)
        return False

    def _release(self, text: str, parts: list[Part]) -> None:
        if self._lead:
            text = text.lstrip()
        if text:
            self._lead = False
            parts.append(ReasoningDelta(text))

    def _answer(self, parts: list[Part]) -> None:
        text, self._buffer = self._buffer, ""
        if self._lead:
            text = text.lstrip()
        if text:
            self._lead = False
            parts.append(ContentDelta(text))


class HarmonySplitter:
    """gpt-oss channels: ``analysis`` is reasoning, ``final`` (and plain commentary) the
    answer, ``commentary to=functions.NAME`` a tool call. A reply that does not start with a
    channel header is all answer."""

    def __init__(self) -> None:
        self._state = "start"  # start -> header <-> body, or start -> plain
        self._buffer = ""
        self._channel = ""
        self._recipient: str | None = None

    @property
    def in_reasoning(self) -> bool:
        return self._state == "body" and self._channel == "analysis"

    def feed(self, text: str) -> list[Part]:
        self._buffer += text
        parts: list[Part] = []
        while self._step(parts):
            pass
        return parts

    def finish(self) -> list[Part]:
        parts: list[Part] = []
        buffer, self._buffer = self._buffer, ""
        if self._state == "body":
            parts += self._body_parts(buffer)
        elif self._state in ("start", "plain") and buffer:
            parts.append(ContentDelta(buffer))
        elif self._state == "header" and buffer.startswith("to="):
            parts.append(ContentDelta(buffer))  # "to=…" that no header followed: plain text
        return parts

    def _step(self, parts: list[Part]) -> bool:
        """One transition; False when more text is needed."""
        if self._state == "start":
            return self._choose()
        if self._state == "plain":
            if self._buffer:
                parts.append(ContentDelta(self._buffer))
                self._buffer = ""
            return False
        if self._state == "header":
            return self._header()
        return self._body(parts)

    def _choose(self) -> bool:
        head = self._buffer.lstrip()
        if head.startswith(_HEADER_STARTS):
            self._state, self._buffer = "header", head
        elif not head or any(m.startswith(head) for m in _HEADER_STARTS):
            return False
        else:
            self._state = "plain"
        return True

    def _header(self) -> bool:
        at = self._buffer.find(H_MESSAGE)
        if at < 0:
            return False
        header, self._buffer = self._buffer[:at], self._buffer[at + len(H_MESSAGE) :]
        channel = header.rsplit(H_CHANNEL, 1)[-1] if H_CHANNEL in header else ""
        self._channel = re.split(r"[\s<]", channel.strip(), maxsplit=1)[0]
        recipient = _RECIPIENT.search(header)
        self._recipient = recipient.group(1) if recipient else None
        self._state = "body"
        return True

    def _body(self, parts: list[Part]) -> bool:
        ends = [(at, m) for m in _BODY_ENDS if (at := self._buffer.find(m)) >= 0]
        if ends:
            at, marker = min(ends)
            parts += self._body_parts(self._buffer[:at])
            rest = self._buffer[at:]
            self._buffer = rest if marker in (H_START, H_CHANNEL) else rest[len(marker) :]
            self._state = "header"
            return True
        if self._is_call():
            return False  # a call's arguments are handed on whole
        keep = _partial_suffix(self._buffer, _BODY_ENDS)
        cut = len(self._buffer) - keep
        parts += self._body_parts(self._buffer[:cut])
        self._buffer = self._buffer[cut:]
        return False

    def _is_call(self) -> bool:
        return self._recipient is not None and self._recipient.startswith("functions.")

    def _body_parts(self, text: str) -> list[Part]:
        if self._is_call():
            name = (self._recipient or "").removeprefix("functions.")
            call = f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {text.strip()}}}'
            return [ContentDelta(call + "</tool_call>")]
        if not text:
            return []
        return [ReasoningDelta(text) if self._channel == "analysis" else ContentDelta(text)]
