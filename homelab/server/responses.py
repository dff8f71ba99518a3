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

from dataclasses import replace

from starlette.responses import Response

from homelab.server.errors import ApiError
from homelab.server.prompting import PreparedChat, chat_inputs, prepare_chat
from homelab.server.responses_output import (
    ResponseEcho,
    output_items,
    output_status,
    response_object,
)
from homelab.server.responses_protocol import ResponsesRequest, chat_request, param_for_chat
from homelab.server.responses_stream import response_events
from homelab.server.serving import (
    RequestContext,
    SamplingKnobs,
    check_finish,
    check_model_name,
    respond,
    submit_choices,
)
from homelab.server.streaming import EventStreamResponse


async def create_response(ctx: RequestContext, req: ResponsesRequest) -> Response:
    prepared = await prepare(ctx, req)
    ctx.new_id("resp_")
    handles, submitted = submit_choices(ctx, [prepared.prompt], 1, prepared.sampling_for)
    states = prepared.reply.choices(submitted, handles)
    echo = ResponseEcho(req, prepared.sampling_for(0, prepared.prompt))
    if req.stream:
        return EventStreamResponse(response_events(ctx, echo, handles, states))

    def body() -> dict[str, object]:
        state = states[0]
        finish = check_finish(state.finish)
        output = output_items(*state.parts())
        return response_object(ctx, echo, output_status(finish.reason, output), output, state)

    return await respond(ctx, handles, states, body)


async def prepare(ctx: RequestContext, req: ResponsesRequest) -> PreparedChat:
    """The one chat preparation, errors named as Responses parameters."""
    check_model_name(ctx.config, req.model)
    try:
        creq = chat_request(req)
        effort = req.reasoning.effort if req.reasoning else None
        inputs = replace(chat_inputs(creq), reasoning_effort=effort)
        return await prepare_chat(ctx, inputs, SamplingKnobs.of(creq), creq.requested_max_tokens())
    except ApiError as error:
        raise param_for_chat(error) from None
