"""``POST /v1/responses``: OpenAI's Responses API, stateless, on top of the chat path.

The request is translated into the chat request it means (:mod:`responses_protocol`), then
checked, rendered and submitted exactly as ``/v1/chat/completions`` does it (model name,
template, tools, JSON-schema grammar, context and token limits, tenant, metrics). What comes
back is shaped as a ``response`` object: a ``message`` item with ``output_text`` content and
one ``function_call`` item per tool call, ``status`` "incomplete" when ``max_output_tokens``
cut the output. ``stream: true`` sends the ``response.*`` events (see
:mod:`responses_stream`).
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
from homelab.server.responses_protocol import ResponsesRequest, chat_request, param_for_chat
from homelab.server.serving import (
    ChoiceState,
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
from homelab.server.tools import split_tool_calls

CLIENT_GONE_STATUS = 499


@dataclass(frozen=True)
class Prepared:
    """A Responses request made ready to submit."""

    req: ResponsesRequest
    chat: ChatCompletionRequest
    prompt: Prompt
    sampling_for: Callable[[int, Prompt], SamplingParams]
    parse_tools: bool


async def create_response(ctx: RequestContext, req: ResponsesRequest) -> Response:
    prepared = await prepare(ctx, req)
    ctx.request_id = new_id("resp")
    handles, states = submit_choices(ctx, [prepared.prompt], 1, prepared.sampling_for)
    if req.stream:
        from homelab.server.responses_stream import response_events

        return EventStreamResponse(response_events(ctx, prepared, handles, states))
    if not await collect(ctx, handles, states):
        record(ctx, states, cancelled=True)
        return Response(status_code=CLIENT_GONE_STATUS)
    record(ctx, states)
    state = states[0]
    finish = check_finish(state.finish)
    output = output_items(state.text, prepared.parse_tools)
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
        text = await chat.render(ctx, creq.messages, tools)
        tokens = await tokenize(ctx.engine, text, add_bos=True)
        max_tokens = max_tokens_for(
            ctx, creq.requested_max_tokens(), ctx.config.default_max_tokens, len(tokens)
        )
    except ApiError as error:
        raise param_for_chat(error) from None
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

    return Prepared(req, creq, Prompt(tokens, text), sampling_for, tools is not None)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


# --- output items ---------------------------------------------------------------------------


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    content = [] if text is None else [text_part(text)]
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


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


def output_items(text: str, parse_tools: bool) -> list[dict[str, Any]]:
    """A finished output as items: the message (when there is text, or nothing else), then
    one function_call per tool call, split the same way the stream splits it."""
    content, calls = split_tool_calls(text) if parse_tools else (text, [])
    items = [message_item(new_id("msg"), content)] if content or not calls else []
    return items + [call_item(new_id("fc"), call) for call in calls]


def output_status(reason: str, output: list[dict[str, Any]]) -> str:
    """ "incomplete" when the token budget cut the output, unless it still made a call."""
    called = any(item["type"] == "function_call" for item in output)
    return "incomplete" if reason == "length" and not called else "completed"


# --- the response object --------------------------------------------------------------------


def response_usage(state: ChoiceState) -> dict[str, Any] | None:
    stats = state.finish.stats if state.finish else None
    if stats is None:
        return None
    return {
        "input_tokens": stats.prompt_tokens,
        "input_tokens_details": {"cached_tokens": stats.cached_tokens},
        "output_tokens": stats.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
    }


def response_object(
    ctx: RequestContext,
    prepared: Prepared,
    status: str,
    output: list[dict[str, Any]],
    state: ChoiceState | None = None,
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
