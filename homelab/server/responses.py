"""``POST /v1/responses``: OpenAI's Responses API, on top of the chat path.

The request is translated into the chat request it means (:mod:`responses_protocol`), then
checked, rendered and submitted exactly as ``/v1/chat/completions`` does it (model name,
template, tools, JSON-schema grammar, context and token limits, tenant, metrics). What comes
back is shaped as a ``response`` object: a ``message`` item with ``output_text`` content and
one ``function_call`` item per tool call, ``status`` "incomplete" when ``max_output_tokens``
cut the output. A reasoning model's thinking (split the way chat's ``reasoning_content``
is, see :mod:`homelab.server.replies`) comes first, as a ``reasoning`` item with
``reasoning_text`` content; ``reasoning.effort`` reaches templates that read it.
``stream: true`` sends the ``response.*`` events (see :mod:`responses_stream`).

Responses are stored (unless ``store: false``) in the tenant's part of a bounded
:class:`~homelab.server.response_store.ResponseStore`; ``previous_response_id`` puts the
stored conversation before the new input. Tools of types other than ``function`` are left
out with a ``Warning`` header and a log line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import anyio.to_thread
from starlette.responses import Response

from homelab.server.errors import ApiError, invalid_request
from homelab.server.prompting import PreparedChat, chat_inputs, prepare_chat
from homelab.server.protocol import ChatCompletionRequest
from homelab.server.response_store import ResponseStore, input_items
from homelab.server.responses_output import (
    ResponseEcho,
    output_items,
    output_status,
    response_object,
)
from homelab.server.responses_protocol import (
    ResponsesRequest,
    chat_request,
    image_parts,
    param_for_chat,
)
from homelab.server.responses_stream import response_events
from homelab.server.serving import (
    RequestContext,
    SamplingKnobs,
    check_finish,
    check_model_name,
    respond,
    submit_choices,
)
from homelab.server.streaming import EventStreamResponse, next_event_ready

log = logging.getLogger("homelab.server.responses")
PLAIN_NAME = re.compile(r"[^A-Za-z0-9_.:/-]")  # what a tool type may show in a header
MAX_WARNED_TYPES = 8
MAX_WARNED_NAME_CHARS = 64


async def create_response(
    ctx: RequestContext, req: ResponsesRequest, store: ResponseStore | None = None
) -> Response:
    """One response; with ``store``, earlier ones continue (``previous_response_id``) and this
    one is kept unless ``store: false``."""
    req = _continued(ctx, req, store)
    headers = _warning_headers(req)  # before anything is submitted: nothing can raise after
    prepared = await prepare(ctx, req)
    ctx.new_id("resp_")
    handles, submitted = submit_choices(ctx, [prepared.prompt], 1, prepared.sampling_for)
    states = prepared.reply.choices(submitted, handles)
    keep = _keeper(ctx, req, store)
    echo = ResponseEcho(req, prepared.sampling_for(0, prepared.prompt), keep)
    if req.stream:
        events = response_events(ctx, echo, handles, states)
        stream = EventStreamResponse(events, next_event_ready(handles), handles=handles)
        stream.headers.update(headers)
        return stream

    def body() -> dict[str, object]:
        state = states[0]
        finish = check_finish(state.finish)
        output = output_items(*state.parts())
        status = output_status(finish.reason, output)
        return echo.done(response_object(ctx, echo, status, output, state))

    response = await respond(ctx, handles, states, body)
    response.headers.update(headers)
    return response


def _continued(
    ctx: RequestContext, req: ResponsesRequest, store: ResponseStore | None
) -> ResponsesRequest:
    """``req`` with the stored conversation it continues put before its input."""
    if req.previous_response_id is None:
        return req
    if store is None:
        raise invalid_request(
            "previous_response_id needs stored responses, which this server does not keep.",
            param="previous_response_id",
        )
    earlier = store.get(ctx.tenant.name, req.previous_response_id, param="previous_response_id")
    return req.model_copy(update={"input": [*earlier.items, *input_items(req.input)]})


def _keeper(
    ctx: RequestContext, req: ResponsesRequest, store: ResponseStore | None
) -> Callable[[dict[str, Any]], None] | None:
    if store is None or req.store is False:
        return None
    tenant, items = ctx.tenant.name, input_items(req.input)
    return lambda response: store.put(tenant, response, items)


def _warning_headers(req: ResponsesRequest) -> dict[str, str]:
    """Tools this server cannot run were left out: said in a header and the log, not a 400
    (Codex offers web_search, local_shell… beside its function tools). The types are the
    client's text: only their plain ASCII name characters reach the header and the log."""
    ignored = [_plain(name) for name in req.ignored_tool_types[:MAX_WARNED_TYPES]]
    if not ignored:
        return {}
    message = f"tools of type {', '.join(ignored)} were ignored (function tools only)"
    log.warning("responses: %s", message)
    return {"Warning": f'299 homelab "{message}"'}


def _plain(name: str) -> str:
    kept = PLAIN_NAME.sub("?", str(name)[:MAX_WARNED_NAME_CHARS])
    return kept or "?"


async def _chat_request(ctx: RequestContext, req: ResponsesRequest) -> ChatCompletionRequest:
    """As chat; off the event loop when images are in it (an earlier response's are decoded
    again here)."""
    policy = ctx.config.image_policy
    if next(image_parts(req.input), None) is None:
        return chat_request(req, policy)
    return await anyio.to_thread.run_sync(chat_request, req, policy)


async def prepare(ctx: RequestContext, req: ResponsesRequest) -> PreparedChat:
    """The one chat preparation, errors named as Responses parameters."""
    check_model_name(ctx.config, req.model)
    try:
        creq = await _chat_request(ctx, req)
        effort = req.reasoning.effort if req.reasoning else None
        inputs = replace(chat_inputs(creq), reasoning_effort=effort)
        return await prepare_chat(ctx, inputs, SamplingKnobs.of(creq), creq.requested_max_tokens())
    except ApiError as error:
        raise param_for_chat(error) from None
