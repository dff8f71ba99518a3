"""``POST /v1/responses``: OpenAI's Responses API, on top of the chat path.

:func:`chat_inputs` maps the request (validated in :mod:`responses_protocol`) to the one chat
preparation: instructions as a system message, input items as the template's messages (a
reasoning item opens the assistant turn it belongs to as its ``reasoning_content``, rendered
back where the template allows, for the prefix cache), function tools, ``tool_choice`` and
``text.format``. Errors found there name the Responses parameter
(``input[2].content[0].type``), and so do the chat preparation's (:func:`param_for_chat`).
It is then checked, rendered and submitted exactly as ``/v1/chat/completions`` does it (model
name, template, tools, JSON-schema grammar, context and token limits, tenant, metrics). What comes
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
from collections.abc import Callable, Mapping
from typing import Any

import anyio.to_thread
from starlette.responses import Response

from homelab.server.errors import ApiError, invalid_request
from homelab.server.image_parts import (
    ImagePolicy,
    check_image_count,
    image_context,
    image_from_url,
)
from homelab.server.prompting import ChatInputs, PreparedChat, prepare_chat
from homelab.server.response_store import ResponseStore, input_items
from homelab.server.responses_output import (
    ResponseEcho,
    output_items,
    output_status,
    response_object,
)
from homelab.server.responses_protocol import (
    STATELESS,
    FunctionTool,
    ResponsesRequest,
    decoded_reasoning,
    image_parts,
    input_image_url,
)
from homelab.server.responses_stream import response_events
from homelab.server.serving import (
    INLINE_TURNS,
    RequestContext,
    SamplingKnobs,
    check_finish,
    check_model_name,
    preparation_lane,
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
    earlier = store.get(ctx.tenant.identity, req.previous_response_id, param="previous_response_id")
    return req.model_copy(update={"input": [*earlier.items, *input_items(req.input)]})


def _keeper(
    ctx: RequestContext, req: ResponsesRequest, store: ResponseStore | None
) -> Callable[[dict[str, Any]], None] | None:
    if store is None or req.store is False:
        return None
    tenant, items = ctx.tenant.identity, input_items(req.input)
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


async def prepare(ctx: RequestContext, req: ResponsesRequest) -> PreparedChat:
    """The one chat preparation, errors named as Responses parameters; off the event loop
    when the input is long or holds images (an earlier response's are decoded again here)."""
    check_model_name(ctx.config, req.model)
    policy = ctx.config.image_policy
    knobs = SamplingKnobs(temperature=req.temperature, top_p=req.top_p)
    try:
        turns = len(req.input) if isinstance(req.input, list) else 1
        if turns > INLINE_TURNS or next(image_parts(req.input), None) is not None:
            lane = preparation_lane(ctx.http.scope)  # long, or images to decode
            inputs = await anyio.to_thread.run_sync(chat_inputs, req, policy, limiter=lane)
        else:
            inputs = chat_inputs(req, policy)
        return await prepare_chat(ctx, inputs, knobs, req.max_output_tokens)
    except ApiError as error:
        raise param_for_chat(error) from None


# --- the request as chat inputs --------------------------------------------------------------

TEXT_PART_TYPES = frozenset({"input_text", "output_text", "text"})


def chat_inputs(req: ResponsesRequest, policy: ImagePolicy | None = None) -> ChatInputs:
    """A Responses request as :class:`ChatInputs` (raises ApiError naming the Responses
    parameter); its images are those decoded when ``req`` was parsed (earlier responses'
    ones under ``policy``)."""
    turns = messages(req.instructions, req.input)
    choice = tool_choice(req.tool_choice)
    turns = _with_images(turns, image_context(policy or ImagePolicy(), req.images_by_url))
    fmt = req.text.format if req.text else None
    return ChatInputs(
        messages=[_template_message(turn) for turn in turns],
        tools=[chat_tool(tool) for tool in req.function_tools()] or None,
        tool_choice=choice,
        answer_format=fmt.type if fmt is not None else "text",
        answer_schema=fmt.schema_ if fmt is not None and fmt.type == "json_schema" else None,
        reasoning_effort=req.reasoning.effort if req.reasoning else None,
    )


def chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function = tool.model_dump(exclude_none=True, exclude={"type"})
    return {"type": "function", "function": function}


def tool_choice(value: Any) -> str | None:
    """Responses' ``tool_choice`` in :class:`ChatInputs`' terms (``{"type": "function",
    "name": N}`` is ``"function:N"``)."""
    if value is None or (isinstance(value, str) and value in ("none", "auto", "required")):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        name = value.get("name")
        if isinstance(name, str) and name:
            return f"function:{name}"
    raise invalid_request(
        "tool_choice must be 'none', 'auto', 'required' or "
        '{"type": "function", "name": ...} (only function tools are supported).',
        param="tool_choice",
    )


def _template_message(turn: Mapping[str, Any]) -> dict[str, Any]:
    """A turn in the chat template's shape, its keys in chat's order (a call's turn without
    text has content "")."""
    message: dict[str, Any] = {"role": turn["role"], "content": turn["content"] or ""}
    for key in ("tool_calls", "tool_call_id", "reasoning_content"):
        if turn.get(key):
            message[key] = turn[key]
    return message


def _with_images(turns: list[dict[str, Any]], context: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each ``image_url`` part as the common form's image part: decoded when the request was
    parsed (an earlier response's images now, under the server's image policy)."""
    parts = [p for turn in turns if isinstance(turn["content"], list) for p in turn["content"]]
    try:
        check_image_count(sum(part["type"] == "image_url" for part in parts), context)
        return [
            {**turn, "content": [_image_part(part, context) for part in turn["content"]]}
            if isinstance(turn["content"], list)
            else turn
            for turn in turns
        ]
    except ValueError as exc:
        raise invalid_request(f"Invalid value for 'input': {exc}", param="input") from None


def _image_part(part: dict[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    if part["type"] != "image_url":
        return part
    return {"type": "image", "image": image_from_url(part["image_url"]["url"], context)}


# --- input items as the template's messages ---------------------------------------------------


def messages(instructions: str | None, value: Any) -> list[dict[str, Any]]:
    """Chat messages for the instructions and the input (a string or a list of items)."""
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    if isinstance(value, str):
        return [*out, {"role": "user", "content": value}]
    if not isinstance(value, list):
        raise invalid_request("input must be a string or a list of input items.", param="input")
    if not value:
        raise invalid_request("input must not be an empty list.", param="input")
    for index, item in enumerate(value):
        _add_item(out, item, f"input[{index}]")
    if out and _reasoning_only(out[-1]):
        out.pop()  # reasoning that nothing followed: no empty assistant turn
    if not any(m["role"] != "system" for m in out):
        raise invalid_request("input needs at least one message or item.", param="input")
    return out


def _add_item(out: list[dict[str, Any]], item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise invalid_request(f"{where} must be an object (an input item).", param=where)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        _add_message(out, _message(item, where))
    elif kind == "function_call":
        _add_call(out, item, where)
    elif kind == "function_call_output":
        out.append(_call_output(item, where))
    elif kind == "reasoning":
        _add_reasoning(out, item)
    elif kind == "item_reference":
        raise invalid_request(f"item_reference is not supported: {STATELESS}.", param=where)
    else:
        raise invalid_request(
            f"input items of type {kind!r} are not supported (supported: message, "
            "function_call, function_call_output, reasoning).",
            param=f"{where}.type",
        )


def _add_message(out: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """An assistant message after its reasoning item completes that turn."""
    last = out[-1] if out else None
    if message["role"] == "assistant" and last is not None and _reasoning_only(last):
        last["content"] = message["content"]
        return
    out.append(message)


def _reasoning_only(message: dict[str, Any]) -> bool:
    return (
        message["role"] == "assistant" and not message["content"] and not message.get("tool_calls")
    )


def _add_reasoning(out: list[dict[str, Any]], item: dict[str, Any]) -> None:
    """Earlier reasoning opens the assistant turn it belongs to (its message or calls join
    it), so a template that renders reasoning back gives the tokens the slot holds."""
    text = reasoning_text(item)
    if not text:
        return
    out.append({"role": "assistant", "content": "", "reasoning_content": text})


def reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item's text: its ``reasoning_text`` content, else the ``encrypted_content``
    this server returned (the reasoning itself, see
    :func:`~homelab.server.responses_protocol.encoded_reasoning`), else its
    summary."""
    text = _part_texts(item.get("content"), "reasoning_text")
    if not text and isinstance(item.get("encrypted_content"), str):
        text = decoded_reasoning(item["encrypted_content"])
    return text or _part_texts(item.get("summary"), "summary_text")


def _part_texts(parts: Any, part_type: str) -> str:
    if not isinstance(parts, list):
        return ""
    return "".join(
        p["text"]
        for p in parts
        if isinstance(p, dict) and p.get("type") == part_type and isinstance(p.get("text"), str)
    )


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise invalid_request(
            f"{where}.role must be 'user', 'assistant', 'system' or 'developer'.",
            param=f"{where}.role",
        )
    content = _content(item.get("content"), f"{where}.content")
    if isinstance(content, list) and role != "user":
        raise invalid_request(
            f"{where}.content: images go in user messages, not in a '{role}' message.",
            param=f"{where}.content",
        )
    return {"role": "system" if role == "developer" else role, "content": content}


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message's content in chat's shape: text, or text and ``image_url`` parts."""
    if not isinstance(content, list) or not any(
        isinstance(p, dict) and p.get("type") == "input_image" for p in content
    ):
        return _text(content, where)
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "input_image":
            url = {"url": input_image_url(part)}  # checked when the request was parsed
            parts.append({"type": "image_url", "image_url": url})
        else:
            parts.append({"type": "text", "text": _part_text(part, f"{where}[{index}]")})
    return parts


def _text(content: Any, where: str) -> str:
    """A string, or the text of a list of text parts (files, audio refused; images only in
    a message's content, see :func:`_content`)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid_request(f"{where} must be a string or a list of parts.", param=where)
    texts = []
    for index, part in enumerate(content):
        texts.append(_part_text(part, f"{where}[{index}]"))
    return "".join(texts)


def _part_text(part: Any, where: str) -> str:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise invalid_request(f"{where} must be an object with a 'type'.", param=where)
    kind = part["type"]
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return str(part["refusal"])
    if kind not in TEXT_PART_TYPES:
        raise invalid_request(
            f"content parts of type {kind!r} are not supported here (input_text, "
            "output_text; input_image in a message's content).",
            param=f"{where}.type",
        )
    if not isinstance(part.get("text"), str):
        raise invalid_request(f"{where} needs a string 'text'.", param=f"{where}.text")
    return str(part["text"])


def _add_call(out: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    """A function call the model made earlier: joins the assistant turn it belongs to."""
    name, call_id, arguments = item.get("name"), item.get("call_id"), item.get("arguments")
    for field, value in (("name", name), ("call_id", call_id), ("arguments", arguments)):
        if not isinstance(value, str) or (field != "arguments" and not value):
            raise invalid_request(f"{where}.{field} must be a string.", param=f"{where}.{field}")
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = out[-1] if out else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
        return
    out.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _call_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid_request(f"{where}.call_id must be a string.", param=f"{where}.call_id")
    output = _text(item.get("output"), f"{where}.output")
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def param_for_chat(error: ApiError) -> ApiError:
    """A chat-path error with the Responses parameter's name (``max_tokens`` ->
    ``max_output_tokens``, ``messages`` -> ``input``, ``response_format`` -> ``text.format``)."""
    names = {
        "max_tokens": "max_output_tokens",
        "messages": "input",
        "response_format": "text.format",
    }
    if error.param in names:
        error.param = names[error.param]
        error.message = error.message.replace("max_tokens", "max_output_tokens")
    return error
