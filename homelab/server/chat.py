"""``POST /v1/chat/completions``: the wire request mapped into the one chat preparation
(:func:`chat_inputs`, then :mod:`homelab.server.prompting`), the parsed reply shaped as a
``chat.completion`` or streamed as ``chat.completion.chunk`` events."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from typing import Any

from starlette.responses import Response

from homelab.engine.api import FinishEvent, TokenEvent, TokenLogprob
from homelab.server.engine_seam import HandleLike
from homelab.server.errors import api_error_from
from homelab.server.pieces import (
    ContentDelta,
    ReasoningDelta,
    StreamPiece,
    ToolCall,
    ToolCallArgs,
    ToolCallStart,
)
from homelab.server.prompting import ChatInputs, prepare_chat
from homelab.server.protocol import ChatCompletionRequest, ChatMessage
from homelab.server.replies import ParsedChoice, ReplyFormat
from homelab.server.serving import (
    ChoiceState,
    RequestContext,
    SamplingKnobs,
    cancel_all,
    check_choices,
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
    DONE,
    EventStreamResponse,
    next_event_ready,
    sse_error,
    sse_event,
    text_events,
)


async def chat_completion(ctx: RequestContext, req: ChatCompletionRequest) -> Response:
    check_model_name(ctx.config, req.model)
    check_choices(ctx.config, req.n)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    knobs = SamplingKnobs.of(req, logprobs)
    inputs = await off_the_loop_when_long(ctx, partial(chat_inputs, req), len(req.messages))
    prepared = await prepare_chat(ctx, inputs, knobs, req.requested_max_tokens())
    ctx.new_id("chatcmpl-")
    handles, submitted = submit_choices(ctx, [prepared.prompt], req.n, prepared.sampling_for)
    states = prepared.reply.choices(submitted, handles)
    if req.stream:
        return EventStreamResponse(
            _stream(ctx, req, handles, states, prepared.reply),
            next_event_ready(handles),
            handles=handles,
        )
    return await respond(
        ctx,
        handles,
        states,
        lambda: {
            **_header(ctx, req, "chat.completion"),
            "choices": [_choice(state, req.logprobs) for state in states],
            "usage": chat_usage(states, prepared.reply),
        },
    )


# --- the request as chat inputs --------------------------------------------------------------


def chat_inputs(req: ChatCompletionRequest) -> ChatInputs:
    """A Chat Completions request as :class:`ChatInputs`."""
    fmt = req.response_format
    return ChatInputs(
        messages=[template_message(m) for m in req.messages],
        tools=[tool.model_dump(exclude_none=True) for tool in req.tools] if req.tools else None,
        tool_choice=req.tool_choice,
        answer_format=fmt.type if fmt is not None else "text",
        answer_schema=fmt.json_schema.schema_ if fmt is not None and fmt.json_schema else None,
        template_kwargs=req.chat_template_kwargs,
        reasoning_effort=req.reasoning_effort,
        reasoning_format=req.reasoning_format,
    )


def template_message(message: ChatMessage) -> dict[str, Any]:
    rendered: dict[str, Any] = {
        "role": "system" if message.role == "developer" else message.role,
        "content": message.template_content(),  # text, or text and image parts
    }
    if message.tool_calls:
        rendered["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    reasoning = message.reasoning_content or message.reasoning
    if reasoning and message.role == "assistant":  # rendered back: the slot holds it
        rendered["reasoning_content"] = reasoning
    if message.name is not None:
        rendered["name"] = message.name
    return rendered


# --- response shapes ------------------------------------------------------------------------


def _header(ctx: RequestContext, req: ChatCompletionRequest, kind: str) -> dict[str, Any]:
    return {
        "id": ctx.request_id,
        "object": kind,
        "created": ctx.created,
        "model": req.model,
        "system_fingerprint": None,
    }


def _choice(state: ParsedChoice, want_logprobs: bool) -> dict[str, Any]:
    finish = check_finish(state.finish)
    reasoning, content, calls = state.parts()
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content if content or not calls else None,
    }
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [_call_json(call) for call in calls]
    return {
        "index": state.index,
        "message": message,
        "logprobs": {"content": [logprob_entry(lp) for lp in state.logprobs]}
        if want_logprobs
        else None,
        "finish_reason": "tool_calls" if calls else finish.reason,
    }


def chat_usage(states: Sequence[ChoiceState], reply: ReplyFormat) -> dict[str, Any]:
    """OpenAI usage; for a model that reasons, the completion tokens spent reasoning too."""
    totals = usage(states)
    if reply.reasoning is not None:
        reasoning_tokens = sum(
            min(state.reply.reasoning_tokens, state.finish.stats.completion_tokens)
            for state in states
            if isinstance(state, ParsedChoice) and state.finish is not None
        )
        totals["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return totals


def _call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {} if index is None else {"index": index}
    body.update(
        id=call.id, type="function", function={"name": call.name, "arguments": call.arguments_json}
    )
    return body


def logprob_entry(lp: TokenLogprob) -> dict[str, Any]:
    return {
        "token": lp.token,
        "logprob": lp.logprob,
        "bytes": list(lp.token.encode()),
        "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in lp.top],
    }


# --- streaming ------------------------------------------------------------------------------


class _ChunkWriter:
    def __init__(self, ctx: RequestContext, req: ChatCompletionRequest) -> None:
        self._base = _header(ctx, req, "chat.completion.chunk")
        if req.include_usage():
            self._base["usage"] = None
        self.want_logprobs = req.logprobs
        # (choice, "content" or "reasoning_content") -> its text-only chunks (text_events)
        self._text_chunks: dict[tuple[int, str], Callable[[str], bytes]] = {}

    def chunk(
        self,
        index: int,
        delta: dict[str, Any],
        finish_reason: str | None = None,
        logprobs: list[Any] | None = None,
    ) -> bytes:
        return sse_event(self._payload(index, delta, finish_reason, logprobs))

    def text_chunk(self, index: int, key: str, text: str) -> bytes:
        """``chunk(index, {key: text})``, its bytes around the text made once per choice."""
        chunks = self._text_chunks.get((index, key))
        if chunks is None:
            chunks = text_events(lambda text: self._payload(index, {key: text}))
            self._text_chunks[(index, key)] = chunks
        return chunks(text)

    def _payload(
        self,
        index: int,
        delta: dict[str, Any],
        finish_reason: str | None = None,
        logprobs: list[Any] | None = None,
    ) -> dict[str, Any]:
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": {"content": logprobs}
            if self.want_logprobs and logprobs is not None
            else None,
            "finish_reason": finish_reason,
        }
        return {**self._base, "choices": [choice]}

    def usage_chunk(self, totals: dict[str, Any]) -> bytes:
        return sse_event({**self._base, "choices": [], "usage": totals})


async def _stream(
    ctx: RequestContext,
    req: ChatCompletionRequest,
    handles: Sequence[HandleLike],
    states: list[ParsedChoice],
    reply: ReplyFormat,
) -> AsyncIterator[bytes]:
    writer = _ChunkWriter(ctx, req)
    calls_sent = [0] * len(states)
    completed = False
    try:
        for state in states:
            yield writer.chunk(state.index, {"role": "assistant", "content": ""})
        async for index, event in merged_events(handles):
            states[index].add(event)
            if isinstance(event, TokenEvent):
                pieces = states[index].take()
                logprobs = [logprob_entry(event.logprob)] if event.logprob is not None else None
                for chunk in _piece_chunks(writer, index, pieces, logprobs, calls_sent):
                    yield chunk
                continue
            yield _finish_chunks(writer, index, event, states[index].take(), calls_sent)
        if req.include_usage():
            yield writer.usage_chunk(chat_usage(states, reply))
        completed = True
        yield DONE
    except Exception as exc:  # after the stream started: an error event, then [DONE]
        completed = True
        yield sse_error(api_error_from(exc))
        yield DONE
    finally:
        cancel_all(handles)
        record(ctx, states, cancelled=not completed)


def _piece_chunks(
    writer: _ChunkWriter,
    index: int,
    pieces: list[StreamPiece],
    logprobs: list[Any] | None,
    calls_sent: list[int],
) -> list[bytes]:
    chunks = []
    for piece in pieces:
        if isinstance(piece, ToolCall):
            continue  # its start and arguments went out as the model wrote them
        if logprobs is None and isinstance(piece, ContentDelta | ReasoningDelta):
            key = "content" if isinstance(piece, ContentDelta) else "reasoning_content"
            chunks.append(writer.text_chunk(index, key, piece.text))
            continue
        delta = _piece_delta(piece)
        calls_sent[index] += isinstance(piece, ToolCallStart)
        chunks.append(writer.chunk(index, delta, logprobs=logprobs))
        logprobs = None
    if not chunks and logprobs is not None:  # token held back (partial character, tool tag)
        chunks.append(writer.chunk(index, {"content": ""}, logprobs=logprobs))
    return chunks


def _piece_delta(piece: ContentDelta | ReasoningDelta | ToolCallStart | ToolCallArgs) -> Any:
    """A streamed piece as a chunk's ``delta``: a call's index, id and name come once, then
    its arguments in fragments."""
    if isinstance(piece, ContentDelta):
        return {"content": piece.text}
    if isinstance(piece, ReasoningDelta):
        return {"reasoning_content": piece.text}
    if isinstance(piece, ToolCallStart):
        function = {"name": piece.name, "arguments": ""}
        call = {"index": piece.index, "id": piece.id, "type": "function", "function": function}
        return {"tool_calls": [call]}
    return {"tool_calls": [{"index": piece.index, "function": {"arguments": piece.fragment}}]}


def _finish_chunks(
    writer: _ChunkWriter,
    index: int,
    event: FinishEvent,
    pieces: list[StreamPiece],
    calls_sent: list[int],
) -> bytes:
    finish = check_finish(event)  # raises: reported as an error event
    chunks = _piece_chunks(writer, index, pieces, None, calls_sent)
    reason = "tool_calls" if calls_sent[index] else finish.reason
    chunks.append(writer.chunk(index, {}, finish_reason=reason))
    return b"".join(chunks)
