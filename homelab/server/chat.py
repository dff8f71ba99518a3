"""``POST /v1/chat/completions``: template, tools, JSON mode, streaming and not."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import anyio.to_thread
from starlette.responses import JSONResponse, Response

from homelab.engine.api import FinishEvent, SamplingParams, TokenEvent, TokenLogprob
from homelab.engine.chat import ToolCall
from homelab.engine.grammar import JSON_OBJECT_GRAMMAR, schema_to_grammar
from homelab.errors import EngineError
from homelab.server.errors import api_error_from, invalid_request, prompt_too_long
from homelab.server.protocol import ChatCompletionRequest, ChatMessage
from homelab.server.reasoning import ReasoningDelta, after_thought, thinking_switches
from homelab.server.replies import ParsedChoice, ReplyFormat, ReplyPiece, split_format
from homelab.server.serving import (
    INLINE_CHARS,
    ChoiceState,
    EngineLike,
    HandleLike,
    Prompt,
    RequestContext,
    cancel_all,
    check_choices,
    check_finish,
    check_model_name,
    collect,
    max_tokens_for,
    merged_events,
    record,
    sampling_params,
    submit_choices,
    tokenize,
    usage,
)
from homelab.server.streaming import DONE, EventStreamResponse, sse_error, sse_event
from homelab.server.tools import ContentDelta, forced_call_grammar, uses_tagged_calls

CLIENT_GONE_STATUS = 499  # nobody reads it; the client disconnected


async def chat_completion(ctx: RequestContext, req: ChatCompletionRequest) -> Response:
    prompt, sampling_for, reply = await _prepare(ctx, req)
    ctx.new_id("chatcmpl")
    handles, submitted = submit_choices(ctx, [prompt], req.n, sampling_for)
    states = reply.choices(submitted, handles)
    if req.stream:
        return EventStreamResponse(_stream(ctx, req, handles, states, reply))
    if not await collect(ctx, handles, states):
        record(ctx, states, cancelled=True)
        return Response(status_code=CLIENT_GONE_STATUS)
    record(ctx, states)
    choices = [_choice(state, req.logprobs) for state in states]
    body = {
        **_header(ctx, req, "chat.completion"),
        "choices": choices,
        "usage": chat_usage(states, reply),
    }
    return JSONResponse(body)


async def _prepare(
    ctx: RequestContext, req: ChatCompletionRequest
) -> tuple[Prompt, Callable[[int, Prompt], SamplingParams], ReplyFormat]:
    """Everything checked and rendered: (prompt, sampling per choice, how to parse replies)."""
    check_model_name(ctx.config, req.model)
    check_choices(ctx.config, req.n)
    template = ctx.engine.chat_template
    if template is None:
        raise invalid_request(
            "This model has no chat template; use /v1/completions.", param="messages"
        )
    tools = offered_tools(req, template)
    grammar = output_grammar(req, tools, template)
    switches = thinking_switches(
        getattr(template, "source", ""),
        req.chat_template_kwargs,
        reasoning_effort=req.reasoning_effort,
        default_enable_thinking=ctx.config.enable_thinking,
    )
    text = await render(ctx, req.messages, tools, switches)
    tokens = await tokenize(ctx.engine, text, add_bos=True)  # the engine drops a doubled BOS
    reasoning = split_format(template, ctx.config.reasoning_format, req.reasoning_format)
    reply = ReplyFormat.for_prompt(ctx.engine, reasoning, text, parse_tools=tools is not None)
    if grammar is not None and reply.opened:  # the reply starts inside <think>: let it think
        grammar = after_thought(grammar)
    max_tokens = max_tokens_for(
        ctx, req.requested_max_tokens(), ctx.config.default_max_tokens, len(tokens)
    )
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    n_vocab = ctx.engine.model_info.n_vocab

    def sampling_for(index: int, _: Prompt) -> SamplingParams:
        return sampling_params(
            req,
            max_tokens=max_tokens,
            n_vocab=n_vocab,
            logprobs=logprobs,
            grammar=grammar,
            choice_index=index,
        )

    return Prompt(tokens, text), sampling_for, reply


def offered_tools(req: ChatCompletionRequest, template: Any) -> list[dict[str, Any]] | None:
    """Tools to render into the prompt (None: render and parse none)."""
    if not req.tools or req.tool_choice == "none":
        return None
    if not getattr(template, "supports_tools", False):
        raise invalid_request("This model's chat template does not support tools.", param="tools")
    names = {tool.function.name for tool in req.tools}
    choice = req.tool_choice
    if isinstance(choice, str) and choice.startswith("function:") and choice[9:] not in names:
        raise invalid_request(
            f"tool_choice names '{choice[9:]}', which is not in tools.", param="tool_choice"
        )
    return [tool.model_dump(exclude_none=True) for tool in req.tools]


def output_grammar(
    req: ChatCompletionRequest, tools: list[dict[str, Any]] | None, template: Any
) -> str | None:
    forced = req.tool_choice == "required" or str(req.tool_choice).startswith("function:")
    fmt = req.response_format
    if tools and forced:
        if fmt is not None and fmt.type != "text":
            raise invalid_request(
                "response_format cannot be combined with a forced tool_choice.",
                param="response_format",
            )
        only = req.tool_choice[9:] if str(req.tool_choice).startswith("function:") else None
        tagged = uses_tagged_calls(getattr(template, "source", ""))
        return _grammar_or_400(lambda: forced_call_grammar(tools, only, tagged), "tools")
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return JSON_OBJECT_GRAMMAR
    schema = fmt.json_schema.schema_ if fmt.json_schema else {}
    return _grammar_or_400(lambda: schema_to_grammar(schema), "response_format")


def _grammar_or_400(make: Any, param: str) -> str:
    try:
        return str(make())
    except EngineError as exc:
        raise invalid_request(f"Unusable JSON schema: {exc}", param=param) from exc


async def render(
    ctx: RequestContext,
    messages: Sequence[ChatMessage],
    tools: list[dict[str, Any]] | None,
    switches: Mapping[str, Any] | None = None,
) -> str:
    rendered = [_template_message(m) for m in messages]
    return await render_messages(ctx, rendered, tools, switches)


async def render_messages(
    ctx: RequestContext,
    rendered: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    switches: Mapping[str, Any] | None = None,
) -> str:
    """The prompt for template-shaped messages (``switches``: extra template variables such
    as ``enable_thinking``); a template's refusal is a 400."""
    chars = sum(len(m["content"]) for m in rendered)
    if chars > ctx.engine.n_ctx_per_slot:
        refuse_user_text_beyond_context(ctx.engine, rendered)

    def run() -> str:
        if not switches:
            return ctx.engine.render_chat(rendered, tools)
        template = ctx.engine.chat_template
        return str(template.render(rendered, tools=tools, add_generation_prompt=True, **switches))

    try:
        if chars + len(str(tools or "")) <= INLINE_CHARS:
            return run()
        return str(await anyio.to_thread.run_sync(run))
    except EngineError as exc:  # the template refused these messages (e.g. roles must alternate)
        raise invalid_request(str(exc), param="messages") from exc


def refuse_user_text_beyond_context(engine: EngineLike, messages: Sequence[dict[str, Any]]) -> None:
    """Refuse before rendering (about 25 µs a message) a chat whose user messages alone cannot
    fit: every template renders each user message's text (at most trimmed), and no token
    stands for more than ``longest_token_bytes`` of it. Other roles are left out: some
    templates drop parts of them (earlier turns' reasoning, a system message)."""
    longest = engine.longest_token_bytes
    if not longest:
        return
    size = sum(len(m["content"].strip().encode()) for m in messages if m["role"] == "user")
    at_least = -(-size // longest)
    limit = engine.n_ctx_per_slot - 1
    if at_least > limit:
        detail = (
            f"the user messages' {size} bytes alone are at least {at_least} tokens, "
            f"more than the {limit} that fit"
        )
        raise prompt_too_long(engine.n_ctx_per_slot, detail)


def _template_message(message: ChatMessage) -> dict[str, Any]:
    rendered: dict[str, Any] = {
        "role": "system" if message.role == "developer" else message.role,
        "content": message.text(),
    }
    if message.tool_calls:
        rendered["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
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

    def chunk(
        self,
        index: int,
        delta: dict[str, Any],
        finish_reason: str | None = None,
        logprobs: list[Any] | None = None,
    ) -> bytes:
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": {"content": logprobs}
            if self.want_logprobs and logprobs is not None
            else None,
            "finish_reason": finish_reason,
        }
        return sse_event({**self._base, "choices": [choice]})

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
    pieces: list[ReplyPiece],
    logprobs: list[Any] | None,
    calls_sent: list[int],
) -> list[bytes]:
    chunks = []
    for piece in pieces:
        if isinstance(piece, ContentDelta):
            chunks.append(writer.chunk(index, {"content": piece.text}, logprobs=logprobs))
        elif isinstance(piece, ReasoningDelta):
            chunks.append(writer.chunk(index, {"reasoning_content": piece.text}, logprobs=logprobs))
        else:
            delta = {"tool_calls": [_call_json(piece, calls_sent[index])]}
            calls_sent[index] += 1
            chunks.append(writer.chunk(index, delta, logprobs=logprobs))
        logprobs = None
    if not chunks and logprobs is not None:  # token held back (partial character, tool tag)
        chunks.append(writer.chunk(index, {"content": ""}, logprobs=logprobs))
    return chunks


def _finish_chunks(
    writer: _ChunkWriter,
    index: int,
    event: FinishEvent,
    pieces: list[ReplyPiece],
    calls_sent: list[int],
) -> bytes:
    finish = check_finish(event)  # raises: reported as an error event
    chunks = _piece_chunks(writer, index, pieces, None, calls_sent)
    reason = "tool_calls" if calls_sent[index] else finish.reason
    chunks.append(writer.chunk(index, {}, finish_reason=reason))
    return b"".join(chunks)
