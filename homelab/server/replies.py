"""One choice's output, parsed as it streams: reasoning, answer text, tool calls.

The engine hands over text token by token. :class:`ReplyStream` passes it through the
model's reasoning splitter (:mod:`homelab.server.reasoning`), then the answer part through
stop sequences (the Anthropic route matches them here, to report which one ended the
reply) and the tool-call parser (:class:`~homelab.server.tools.ToolCallStream`). Chat
Completions and the Messages API read the same pieces, collected or streamed:
:class:`ParsedChoice` is a :class:`~homelab.server.serving.ChoiceState` that parses each event
it is given, so ``collect`` and the streaming loops need nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from homelab.engine.api import FinishEvent, TokenEvent
from homelab.server.engine_seam import EngineLike, HandleLike, TemplateLike
from homelab.server.pieces import (
    ContentDelta,
    ReasoningDelta,
    ReplyPiece,
    StreamPiece,
    ToolCall,
    ToolCallArgs,
    ToolCallStart,
)
from homelab.server.reasoning import Part, ReasoningFormat, detect_reasoning
from homelab.server.serving import ChoiceState
from homelab.server.tools import ToolCallStream, ToolFormat, ToolSet

SPLIT_FORMATS = ("auto", "deepseek")  # "none": reasoning stays in the content


def marker_ids(engine: EngineLike, markers: Sequence[str]) -> dict[int, str]:
    """Token id -> tag, for tags the vocabulary has as one token (a control token's text is
    empty in the output, so the id is what shows that the tag was generated)."""
    ids: dict[int, str] = {}
    for marker in markers:
        tokens = engine.tokenize(marker, add_bos=False, special=True)
        if len(tokens) == 1:
            ids[int(tokens[0])] = marker
    return ids


def split_format(
    template: TemplateLike, server_default: str, requested: str | None = None
) -> ReasoningFormat | None:
    """The reasoning format to split replies by (None: leave everything in the content)."""
    if (requested or server_default) not in SPLIT_FORMATS:
        return None
    return detect_reasoning(template.source)


class StopSequences:
    """Finds the first of several stop strings across chunks, and says which one it was."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self.stops), default=0)
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        if self.matched is not None:
            return ""
        window = self._held + text
        found = [(at, -len(s), s) for s in self.stops if (at := window.find(s)) >= 0]
        if found:
            at, _, self.matched = min(found)
            self._held = ""
            return window[:at]
        keep = self._possible_start(window)
        self._held = window[len(window) - keep :]
        return window[: len(window) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held if self.matched is None else ""

    def _possible_start(self, window: str) -> int:
        for length in range(min(len(window), self._longest - 1), 0, -1):
            end = window[-length:]
            if any(stop.startswith(end) for stop in self.stops):
                return length
        return 0


class ReplyStream:
    def __init__(
        self,
        reasoning: ReasoningFormat | None = None,
        *,
        opened: bool = False,
        parse_tools: bool = False,
        markers: Mapping[int, str] | None = None,
        stops: Sequence[str] = (),
        tool_format: ToolFormat | None = None,
        tools: ToolSet | None = None,
    ) -> None:
        self._splitter = reasoning.splitter(opened) if reasoning else None
        self._tools = ToolCallStream(tool_format, tools) if parse_tools else None
        self._markers = markers or {}
        self._stops = StopSequences(stops) if stops else None
        self.reasoning_tokens = 0
        # nothing to parse or watch for: every token's text is content as it is
        self.plain = self._splitter is None and self._tools is None and self._stops is None

    @property
    def stop_sequence(self) -> str | None:
        """The stop sequence that ended the reply (only for stops given to this stream)."""
        return self._stops.matched if self._stops else None

    def feed(self, event: TokenEvent) -> list[StreamPiece]:
        if self.plain:
            return [*self.content(event)]
        if self.stop_sequence is not None:
            return []
        text = event.text or self._markers.get(event.token_id, "")
        if self._splitter is None:
            return self._answer([ContentDelta(text)] if text else [], final=False)
        was_reasoning = self._splitter.in_reasoning
        parts = self._splitter.feed(text)
        if was_reasoning or self._splitter.in_reasoning:
            self.reasoning_tokens += 1
        return self._answer(parts, final=False)

    def content(self, event: TokenEvent) -> list[ContentDelta]:
        """``feed`` of a plain stream (nothing to parse or watch for): the token's text as
        content — what ``_answer`` would make of it, in fewer calls (once per token)."""
        text = event.text or self._markers.get(event.token_id, "")
        return [ContentDelta(text)] if text else []

    def finish(self) -> list[StreamPiece]:
        if self.stop_sequence is not None:
            return []
        parts = self._splitter.finish() if self._splitter else []
        return self._answer(parts, final=True)

    def _answer(self, parts: list[Part], final: bool) -> list[StreamPiece]:
        out: list[StreamPiece] = []
        for part in parts:
            if isinstance(part, ReasoningDelta):
                out.append(part)
            elif self.stop_sequence is None:
                out += self._to_tools(self._stops.feed(part.text) if self._stops else part.text)
                if self.stop_sequence is not None:  # the reply ends here
                    out += self._tools.finish() if self._tools else []
        if final and self.stop_sequence is None:
            out += self._to_tools(self._stops.flush() if self._stops else "")
            out += self._tools.finish() if self._tools else []
        return [p for p in out if not (isinstance(p, ContentDelta | ReasoningDelta) and not p.text)]

    def _to_tools(self, text: str) -> list[StreamPiece]:
        if not text:
            return []
        return list(self._tools.feed(text)) if self._tools else [ContentDelta(text)]


@dataclass(frozen=True)
class ReplyFormat:
    """How to parse the replies to one request."""

    reasoning: ReasoningFormat | None = None
    opened: bool = False
    parse_tools: bool = False
    markers: Mapping[int, str] = field(default_factory=dict)
    stops: tuple[str, ...] = ()
    tool_format: ToolFormat | None = None  # None: the generic parser
    tools: ToolSet = field(default_factory=ToolSet)

    @classmethod
    def for_prompt(
        cls,
        engine: EngineLike,
        reasoning: ReasoningFormat | None,
        prompt: str,
        *,
        parse_tools: bool,
        stops: Sequence[str] = (),
        opened: bool | None = None,
        tool_format: ToolFormat | None = None,
        tools: ToolSet | None = None,
    ) -> ReplyFormat:
        toolset = tools or ToolSet()
        if reasoning is None:
            return cls(
                parse_tools=parse_tools, stops=tuple(stops), tool_format=tool_format, tools=toolset
            )
        return cls(
            reasoning,
            reasoning.opened_by(prompt) if opened is None else opened,
            parse_tools,
            marker_ids(engine, reasoning.markers),
            tuple(stops),
            tool_format,
            toolset,
        )

    def stream(self) -> ReplyStream:
        return ReplyStream(
            self.reasoning,
            opened=self.opened,
            parse_tools=self.parse_tools,
            markers=self.markers,
            stops=self.stops,
            tool_format=self.tool_format,
            tools=self.tools,
        )

    def choices(
        self, states: Sequence[ChoiceState], handles: Sequence[HandleLike]
    ) -> list[ParsedChoice]:
        """The submitted choices as parsing ones; a matched stop sequence cancels its handle."""
        return [
            ParsedChoice(s.index, s.prompt_index, reply=self.stream(), on_stop=handle.cancel)
            for s, handle in zip(states, handles, strict=True)
        ]


@dataclass
class ParsedChoice(ChoiceState):
    reply: ReplyStream = field(default_factory=ReplyStream)
    on_stop: Callable[[], None] | None = None
    output: list[ReplyPiece] = field(default_factory=list)  # settled: no partial calls
    streamed: list[StreamPiece] = field(default_factory=list)  # with call starts, fragments
    _taken: int = 0

    def add(self, event: TokenEvent | FinishEvent) -> None:
        super().add(event)
        if isinstance(event, FinishEvent):
            self._keep(self.reply.finish())
            return
        if self.reply.plain:  # content alone, no stop sequence: _keep in fewer calls
            pieces = self.reply.content(event)
            self.streamed += pieces
            self.output += pieces
            return
        stopped_before = self.reply.stop_sequence is not None
        self._keep(self.reply.feed(event))
        if not stopped_before and self.reply.stop_sequence is not None and self.on_stop:
            self.on_stop()

    def _keep(self, pieces: list[StreamPiece]) -> None:
        self.streamed += pieces
        self.output += settled(pieces)

    def take(self) -> list[StreamPiece]:
        """Pieces parsed since the last call, call starts and argument fragments included."""
        new, self._taken = self.streamed[self._taken :], len(self.streamed)
        return new

    @property
    def stopped_by_sequence(self) -> bool:
        return self.reply.stop_sequence is not None

    def parts(self) -> tuple[str, str, list[ToolCall]]:
        """(reasoning, content, tool calls) of the whole reply; content is trimmed when there
        are calls, as :func:`~homelab.server.tools.split_tool_calls` does."""
        reasoning = "".join(p.text for p in self.output if isinstance(p, ReasoningDelta))
        content = "".join(p.text for p in self.output if isinstance(p, ContentDelta))
        calls = [p for p in self.output if isinstance(p, ToolCall)]
        return reasoning, (content.strip() if calls else content), calls


def settled(pieces: Sequence[StreamPiece]) -> list[ReplyPiece]:
    """The pieces without call starts and argument fragments (each call is also whole)."""
    return [p for p in pieces if not isinstance(p, ToolCallStart | ToolCallArgs)]


def merged_blocks(pieces: Sequence[ReplyPiece]) -> list[ReplyPiece]:
    """Consecutive reasoning (or content) pieces joined into one."""
    blocks: list[ReplyPiece] = []
    for piece in pieces:
        last = blocks[-1] if blocks else None
        if isinstance(piece, ReasoningDelta) and isinstance(last, ReasoningDelta):
            blocks[-1] = ReasoningDelta(last.text + piece.text)
        elif isinstance(piece, ContentDelta) and isinstance(last, ContentDelta):
            blocks[-1] = ContentDelta(last.text + piece.text)
        else:
            blocks.append(piece)
    return blocks
