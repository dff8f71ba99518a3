"""``POST /v1/responses``: OpenAI's Responses API, stateless, on top of the chat path.

The request is translated into the chat request it means (:mod:`responses_protocol`), then
checked, rendered and submitted exactly as ``/v1/chat/completions`` does it (model name,
template, tools, JSON-schema grammar, context and token limits, tenant, metrics). What comes
back is shaped as a ``response`` object: a ``message`` item with ``output_text`` content and
one ``function_call`` item per tool call, ``status`` "incomplete" when ``max_output_tokens``
cut the output. A reasoning model's thinking (split the way chat's ``reasoning_content``
is, see :mod:`homelab.server.replies`) comes first, as a ``reasoning`` item with
``reasoning_text`` content; ``reasoning.effort`` reaches templates that read it.
``stream: true`` sends the ``response.*`` events (see :mod:`responses_stream`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse, Response

from homelab.engine.api import SamplingParams
from homelab.engine.chat import ToolCall
from homelab.server import chat
from homelab.server.errors import ApiError
from homelab.server.protocol import ChatCompletionRequest
from homelab.server.reasoning import after_thought, thinking_switches
from homelab.server.replies import ParsedChoice, ReplyFormat, split_format
from homelab.server.responses_protocol import ResponsesRequest, chat_request, param_for_chat
from homelab.server.serving import (
    Prompt,
    RequestContext,
    check_finish,
    check_model_name,
    collect,
    max_tokens_for,
    record,
    sampling_params,
    submit_choices,
    tokenize,
)
from homelab.server.streaming import EventStreamResponse

CLIENT_GONE_STATUS = 499


@dataclass(frozen=True)
class Prepared:
    """A Responses request made ready to submit."""

    req: ResponsesRequest
    chat: ChatCompletionRequest
    prompt: Prompt
    sampling_for: Callable[[int, Prompt], SamplingParams]
    reply: ReplyFormat  # how to split the output: reasoning, text, tool calls


async def create_response(ctx: RequestContext, req: ResponsesRequest) -> Response:
    prepared = await prepare(ctx, req)
    ctx.request_id = new_id("resp")
    handles, submitted = submit_choices(ctx, [prepared.prompt], 1, prepared.sampling_for)
    states = prepared.reply.choices(submitted, handles)
    if req.stream:
        from homelab.server.responses_stream import response_events

        return EventStreamResponse(response_events(ctx, prepared, handles, states))
    if not await collect(ctx, handles, states):
        record(ctx, states, cancelled=True)
        return Response(status_code=CLIENT_GONE_STATUS)
    record(ctx, states)
    state = states[0]
    finish = check_finish(state.finish)
    output = output_items(*state.parts())
    body = response_object(ctx, prepared, output_status(finish.reason, output), output, state)
    return JSONResponse(body)


async def prepare(ctx: RequestContext, req: ResponsesRequest) -> Prepared:
    """The chat path's checks and rendering, errors named as Responses parameters."""
    check_model_name(ctx.config, req.model)
    try:
        creq = chat_request(req)
        template = ctx.engine.chat_template
        if template is None:
            raise ApiError(
                400, "This model has no chat template; use /v1/completions.", param="input"
            )
        tools = chat.offered_tools(creq, template)
        grammar = chat.output_grammar(creq, tools, template)
        effort = req.reasoning.effort if req.reasoning else None
        switches = thinking_switches(
            getattr(template, "source", ""),
            reasoning_effort=effort,
            default_enable_thinking=ctx.config.enable_thinking,
        )
        text = await chat.render(ctx, creq.messages, tools, switches)
        tokens = await tokenize(ctx.engine, text, add_bos=True)
        max_tokens = max_tokens_for(
            ctx, creq.requested_max_tokens(), ctx.config.default_max_tokens, len(tokens)
        )
    except ApiError as error:
        raise param_for_chat(error) from None
    reasoning = split_format(template, ctx.config.reasoning_format)
    reply = ReplyFormat.for_prompt(ctx.engine, reasoning, text, parse_tools=tools is not None)
    if grammar is not None and reply.opened:  # the reply starts inside <think>: let it think
        grammar = after_thought(grammar)
    n_vocab = ctx.engine.model_info.n_vocab

    def sampling_for(index: int, _: Prompt) -> SamplingParams:
        return sampling_params(
            creq,
            max_tokens=max_tokens,
            n_vocab=n_vocab,
            logprobs=None,
            grammar=grammar,
            choice_index=index,
        )

    return Prepared(req, creq, Prompt(tokens, text), sampling_for, reply)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


# --- output items ---------------------------------------------------------------------------


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    content = [] if text is None else [text_part(text)]
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def reasoning_item(item_id: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    content = [] if text is None else [reasoning_part(text)]
    return {"id": item_id, "type": "reasoning", "status": status, "summary": [], "content": content}


def call_item(item_id: str, call: ToolCall, status: str = "completed") -> dict[str, Any]:
    arguments = call.arguments_json if status == "completed" else ""
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
    }


def output_items(reasoning: str, content: str, calls: list[ToolCall]) -> list[dict[str, Any]]:
    """A finished output as items: the reasoning (if any), the message (when there is text,
    or nothing else), then one function_call per tool call."""
    items = [reasoning_item(new_id("rs"), reasoning)] if reasoning else []
    if content or not calls:
        items.append(message_item(new_id("msg"), content))
    return items + [call_item(new_id("fc"), call) for call in calls]


def output_status(reason: str, output: list[dict[str, Any]]) -> str:
    """ "incomplete" when the token budget cut the output, unless it still made a call."""
    called = any(item["type"] == "function_call" for item in output)
    return "incomplete" if reason == "length" and not called else "completed"


# --- the response object --------------------------------------------------------------------


def response_usage(state: ParsedChoice) -> dict[str, Any] | None:
    stats = state.finish.stats if state.finish else None
    if stats is None:
        return None
    reasoning_tokens = min(state.reply.reasoning_tokens, stats.completion_tokens)
    return {
        "input_tokens": stats.prompt_tokens,
        "input_tokens_details": {"cached_tokens": stats.cached_tokens},
        "output_tokens": stats.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
    }


def response_object(
    ctx: RequestContext,
    prepared: Prepared,
    status: str,
    output: list[dict[str, Any]],
    state: ParsedChoice | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    req = prepared.req
    sampling = prepared.sampling_for(0, prepared.prompt)
    fmt = req.text.format if req.text and req.text.format else None
    return {
        "id": ctx.request_id,
        "object": "response",
        "created_at": ctx.created,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": req.model,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": None,
        "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
        "store": False,
        "temperature": sampling.temperature,
        "text": {
            "format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
        },
        "tool_choice": _tool_choice_echo(req.tool_choice),
        "tools": [tool.model_dump(exclude_none=True) for tool in req.tools or []],
        "top_p": sampling.top_p,
        "truncation": "disabled",
        "usage": response_usage(state) if state is not None else None,
        "user": req.user,
        "metadata": req.metadata or {},
    }


def _tool_choice_echo(value: Any) -> Any:
    return "auto" if value is None else value
