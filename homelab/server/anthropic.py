"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API.

A Messages request becomes the messages the chat template takes (system prompt first, a
``tool_result`` block becomes a ``tool`` message, a ``tool_use`` block an assistant tool
call, a ``thinking`` block the turn's ``reasoning_content``, a ``system`` message among the
turns user text where it stands) and then runs the chat path:
model name, template, tool rendering, the forced-call grammar, context and limits, the
tenant's prefix cache, metrics. A final assistant message is a prefill: the reply continues
it. What comes back is parsed by :mod:`homelab.server.replies` into ``thinking``, ``text`` and
``tool_use`` blocks, collected or streamed as Anthropic's events::

    message_start, ping, (content_block_start, content_block_delta*, content_block_stop)*,
    message_delta (stop_reason, usage), message_stop

``max_tokens`` is required; above :data:`MAX_TOKENS_CEILING` it is refused, below it the
context left after the prompt clamps it (clients such as Claude Code ask for 32000 whatever
the model), and ``stop_reason`` says ``max_tokens`` when that cut the reply. Stop sequences
apply to the answer text (not the thinking) and are matched here, so the response names the
one that matched. Errors on these routes take Anthropic's envelope
(:meth:`~homelab.server.errors.ApiError.anthropic_envelope`), also after streaming started.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from starlette.responses import JSONResponse, Response

from homelab.engine.api import FinishEvent
from homelab.server.anthropic_protocol import (
    MAX_TOKENS_CEILING,
    Conversation,
    CountTokensRequest,
    ImageBlock,
    MessageParam,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from homelab.server.engine_seam import HandleLike
from homelab.server.errors import api_error_from
from homelab.server.pieces import (
    ContentDelta,
    ReasoningDelta,
    ReplyPiece,
    StreamPiece,
    ToolCall,
    ToolCallArgs,
    ToolCallStart,
)
from homelab.server.prompting import ChatInputs, PreparedChat, prepare_chat, render_chat
from homelab.server.replies import ParsedChoice, merged_blocks, settled
from homelab.server.serving import (
    RequestContext,
    SamplingKnobs,
    cancel_all,
    check_finish,
    check_model_name,
    merged_events,
    off_the_loop_when_long,
    record,
    respond,
    submit_choices,
    usage,
)
from homelab.server.streaming import (
    EventStreamResponse,
    next_event_ready,
    sse_event,
    text_events,
)

__all__ = ["MAX_TOKENS_CEILING", "count_tokens", "create_message"]

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}
TOOL_CHOICES = {"any": "required", "auto": "auto", "none": "none"}  # "tool": function:NAME


async def create_message(ctx: RequestContext, req: MessagesRequest) -> Response:
    check_model_name(ctx.config, req.model)
    knobs = SamplingKnobs(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p)
    inputs = await off_the_loop_when_long(
        ctx, functools.partial(chat_inputs, req), len(req.messages)
    )
    prepared = await prepare_chat(ctx, inputs, knobs, req.max_tokens, budget="clamp")
    ctx.new_id("msg_")
    handles, submitted = submit_choices(ctx, [prepared.prompt], 1, prepared.sampling_for)
    choices = prepared.reply.choices(submitted, handles)
    if req.stream:
        return EventStreamResponse(
            _events(ctx, req, prepared, handles, choices),
            next_event_ready(handles),
            handles=handles,
        )
    return await respond(ctx, handles, choices, lambda: message_body(ctx, req, choices[0]))


async def count_tokens(ctx: RequestContext, req: CountTokensRequest) -> Response:
    check_model_name(ctx.config, req.model)
    inputs = await off_the_loop_when_long(
        ctx, functools.partial(chat_inputs, req), len(req.messages)
    )
    rendered = await render_chat(ctx, inputs)
    return JSONResponse({"input_tokens": rendered.n_prompt_tokens})


# --- the conversation as chat inputs ---------------------------------------------------------


def chat_inputs(conv: Conversation) -> ChatInputs:
    """A Messages (or count_tokens) request in the chat template's terms."""
    messages, prefill = template_messages(conv)
    fmt = conv.output_config.format if conv.output_config else None
    return ChatInputs(
        messages=messages,
        tools=[tool.as_function() for tool in conv.tools] if conv.tools else None,
        tool_choice=_tool_choice(conv),
        answer_format="json_schema" if fmt is not None else "text",
        answer_schema=fmt.schema_ if fmt is not None else None,
        prefill=prefill,
        enable_thinking=conv.thinking.enable_thinking() if conv.thinking else None,
        reasoning_effort=conv.output_config.reasoning_effort() if conv.output_config else None,
        reply_stops=tuple(conv.stop_sequences or ()) if isinstance(conv, MessagesRequest) else (),
    )


def _tool_choice(conv: Conversation) -> str | None:
    choice = conv.tool_choice
    if choice is None:
        return None
    return f"function:{choice.name}" if choice.type == "tool" else TOOL_CHOICES[choice.type]


def template_messages(conv: Conversation) -> tuple[list[dict[str, Any]], str]:
    """(the messages the chat template takes, the prefill text of a final assistant turn)."""
    messages = list(conv.messages)
    prefill = ""
    if messages[-1].role == "assistant":
        prefill = messages.pop().text().rstrip()
    rendered: list[dict[str, Any]] = []
    system = conv.system_text()
    if system:
        rendered.append({"role": "system", "content": system})
    for message in messages:
        # a system message among the turns is read as the user's side: many templates drop
        # or refuse a system message after the first (gpt-oss, Qwen3.5, Mistral, Gemma) and it
        # must stay where it is for the prompt to remain a prefix of the next turn's
        is_assistant = message.role == "assistant"
        rendered += [_assistant_turn(message)] if is_assistant else _user_turn(message)
    return _joined_turns(rendered), prefill


def _user_turn(message: MessageParam) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for block in message.blocks():
        if isinstance(block, ToolResultBlock):
            text = f"Error: {block.content}" if block.is_error else str(block.content)
            turns.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": text})
    if any(isinstance(block, ImageBlock) for block in message.blocks()):
        turns.append({"role": "user", "content": _parts(message)})
    elif message.text():
        turns.append({"role": "user", "content": message.text()})
    return turns


def _parts(message: MessageParam) -> list[dict[str, Any]]:
    """A user message with images as the common form's text and image parts, in order."""
    parts: list[dict[str, Any]] = []
    for block in message.blocks():
        if isinstance(block, ImageBlock):
            parts.append({"type": "image", "image": block.image})
        elif isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
    return parts


def _assistant_turn(message: MessageParam) -> dict[str, Any]:
    blocks = message.blocks()
    turn: dict[str, Any] = {"role": "assistant", "content": message.text()}
    thinking = "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock))
    if thinking:
        turn["reasoning_content"] = thinking
    calls = [
        {
            "id": b.id,
            "type": "function",
            "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
        }
        for b in blocks
        if isinstance(b, ToolUseBlock)
    ]
    if calls:
        turn["tool_calls"] = calls
    return turn


def _joined_turns(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive user turns (or assistant turns) as one, as the Messages API joins them."""
    joined: list[dict[str, Any]] = []
    for turn in turns:
        last = joined[-1] if joined else None
        if (
            last is None
            or last["role"] != turn["role"]
            or turn["role"] not in ("user", "assistant")
        ):
            joined.append(dict(turn))
            continue
        last["content"] = _joined_content(last["content"], turn["content"])
        if turn.get("tool_calls"):
            last["tool_calls"] = [*last.get("tool_calls", []), *turn["tool_calls"]]
        if turn.get("reasoning_content"):
            last["reasoning_content"] = (
                last.get("reasoning_content", "") + turn["reasoning_content"]
            )
    return joined


def _joined_content(first: Any, second: Any) -> Any:
    """Two turns' content as one: text joined by a blank line; with images, parts."""
    if isinstance(first, str) and isinstance(second, str):
        return "\n\n".join(t for t in (first, second) if t)
    head, tail = _as_parts(first), _as_parts(second)
    return [*head, {"type": "text", "text": "\n\n"}, *tail] if head and tail else head + tail


def _as_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": content}] if content else []


# --- the response ----------------------------------------------------------------------------


def _finish(choice: ParsedChoice) -> FinishEvent:
    """The finish, or the error it stands for; our own cancel after a stop sequence is fine."""
    if choice.stopped_by_sequence and choice.finish is not None:
        return choice.finish
    return check_finish(choice.finish)


def stop_reason(
    req: MessagesRequest, choice: ParsedChoice, finish: FinishEvent, called: bool
) -> str:
    if req.max_tokens == 0:
        return "max_tokens"
    if called:
        return "tool_use"
    if choice.stopped_by_sequence:
        return "stop_sequence"
    return STOP_REASONS.get(finish.reason, "end_turn")


def message_usage(req: MessagesRequest, choice: ParsedChoice) -> dict[str, int]:
    """Anthropic's usage: input tokens not read from the cache, and those that were."""
    totals = usage([choice])
    cached = totals["prompt_tokens_details"]["cached_tokens"]
    return {
        "input_tokens": totals["prompt_tokens"] - cached,
        "output_tokens": totals["completion_tokens"] if req.max_tokens else 0,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def message_body(ctx: RequestContext, req: MessagesRequest, choice: ParsedChoice) -> dict[str, Any]:
    finish = _finish(choice)
    pieces = merged_blocks(settled(shown(req, choice.output)))
    called = any(isinstance(p, ToolCall) for p in pieces)
    blocks = [block for piece in pieces if (block := _block(piece, called)) is not None]
    return {
        **_message_head(ctx, req),
        "content": blocks,
        "stop_reason": stop_reason(req, choice, finish, called),
        "stop_sequence": choice.reply.stop_sequence,
        "usage": message_usage(req, choice),
    }


def shown(req: MessagesRequest, pieces: Sequence[StreamPiece]) -> list[StreamPiece]:
    """What the client sees: nothing for ``max_tokens`` 0, thinking emptied when "omitted"."""
    if req.max_tokens == 0:
        return []
    if req.thinking_hidden():
        return [ReasoningDelta("") if isinstance(p, ReasoningDelta) else p for p in pieces]
    return list(pieces)


def _message_head(ctx: RequestContext, req: MessagesRequest) -> dict[str, Any]:
    return {"id": ctx.request_id, "type": "message", "role": "assistant", "model": req.model}


def _block(piece: ReplyPiece, called: bool) -> dict[str, Any] | None:
    if isinstance(piece, ReasoningDelta):
        return {"type": "thinking", "thinking": piece.text, "signature": ""}
    if isinstance(piece, ContentDelta):
        text = piece.text.strip() if called else piece.text
        return {"type": "text", "text": text} if text else None
    return {**_tool_use_start(piece), "input": json.loads(piece.arguments_json)}


def _tool_use_start(call: ToolCall | ToolCallStart) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name}


# --- streaming -------------------------------------------------------------------------------


class _Blocks:
    """Opens, fills and closes content blocks as pieces arrive."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "thinking" or "text"
        self.calls = 0
        # the open block's text deltas, their bytes around the text made once (text_events)
        self._text_deltas: tuple[int, Callable[[str], bytes]] | None = None

    def piece(self, piece: StreamPiece) -> list[bytes]:
        if isinstance(piece, ReasoningDelta):
            if not piece.text and self.open == "thinking":
                return []  # thinking "omitted": one empty block
            start = {"type": "thinking", "thinking": "", "signature": ""}
            return [*self._ensure("thinking", start), self._text_delta(piece.text)]
        if isinstance(piece, ContentDelta):
            start = {"type": "text", "text": ""}
            return [*self._ensure("text", start), self._text_delta(piece.text)]
        return self._call(piece)

    def _text_delta(self, text: str) -> bytes:
        """The open block's delta of ``text`` (``thinking_delta`` or ``text_delta``)."""
        if self._text_deltas is None or self._text_deltas[0] != self.index:
            kind = "thinking" if self.open == "thinking" else "text"
            delta_with = functools.partial(_text_delta_payload, self.index, kind)
            self._text_deltas = (self.index, text_events(delta_with, "content_block_delta"))
        return self._text_deltas[1](text)

    def _call(self, piece: ToolCallStart | ToolCallArgs | ToolCall) -> list[bytes]:
        """A tool_use block: opened when the call starts, its input streamed as
        ``input_json_delta`` fragments, closed when the call is whole."""
        if isinstance(piece, ToolCallStart):
            self.calls += 1
            start = self._start({**_tool_use_start(piece), "input": {}})
            events = [*self.close(), *start]
            self.open = "tool_use"
            return events
        if isinstance(piece, ToolCallArgs):
            return [self._delta({"type": "input_json_delta", "partial_json": piece.fragment})]
        return self.close() if self.open == "tool_use" else []

    def close(self, force: bool = False) -> list[bytes]:
        if self.open is None and not force:
            return []
        self.open = None
        return [
            sse_event({"type": "content_block_stop", "index": self.index}, "content_block_stop")
        ]

    def _ensure(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        if self.open == kind:
            return []
        events = self.close()
        self.open = kind
        return [*events, *self._start(block)]

    def _start(self, block: dict[str, Any]) -> list[bytes]:
        self.index += 1
        payload = {"type": "content_block_start", "index": self.index, "content_block": block}
        return [sse_event(payload, "content_block_start")]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse_event(_delta_payload(self.index, delta), "content_block_delta")


def _delta_payload(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _text_delta_payload(index: int, kind: str, text: str) -> dict[str, Any]:
    return _delta_payload(index, {"type": f"{kind}_delta", kind: text})


async def _events(
    ctx: RequestContext,
    req: MessagesRequest,
    prepared: PreparedChat,
    handles: Sequence[HandleLike],
    choices: list[ParsedChoice],
) -> AsyncIterator[bytes]:
    choice, blocks, completed = choices[0], _Blocks(), False
    start_usage = {"input_tokens": prepared.rendered.n_prompt_tokens, "output_tokens": 0}
    message = {
        **_message_head(ctx, req),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    try:
        yield sse_event({"type": "message_start", "message": message}, "message_start")
        yield sse_event({"type": "ping"}, "ping")
        async for _, event in merged_events(handles):
            choice.add(event)
            for piece in shown(req, choice.take()):
                for chunk in blocks.piece(piece):
                    yield chunk
        finish = _finish(choice)
        for chunk in blocks.close():
            yield chunk
        delta = {
            "stop_reason": stop_reason(req, choice, finish, blocks.calls > 0),
            "stop_sequence": choice.reply.stop_sequence,
        }
        yield sse_event(
            {"type": "message_delta", "delta": delta, "usage": message_usage(req, choice)},
            "message_delta",
        )
        completed = True
        yield sse_event({"type": "message_stop"}, "message_stop")
    except Exception as exc:  # after the stream started: Anthropic's error event
        completed = True
        yield sse_event(api_error_from(exc).anthropic_envelope(), "error")
    finally:
        cancel_all(handles)
        record(ctx, choices, cancelled=not completed)
