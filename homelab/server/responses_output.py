"""The Responses API's output: items (reasoning, message, function calls) and the
``response`` object, whole or as the streamed events build it (:mod:`responses_stream`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from homelab.engine.api import SamplingParams
from homelab.server.pieces import ToolCall
from homelab.server.replies import ParsedChoice
from homelab.server.responses_protocol import ResponsesRequest, encoded_reasoning
from homelab.server.serving import RequestContext, new_id


@dataclass(frozen=True)
class ResponseEcho:
    """What the ``response`` object repeats of the request, and the sampling it ran with."""

    req: ResponsesRequest
    sampling: SamplingParams
    on_done: Callable[[dict[str, Any]], None] | None = None  # the finished object (store it)

    def done(self, response: dict[str, Any]) -> dict[str, Any]:
        if self.on_done is not None and response["status"] != "failed":
            self.on_done(response)
        return response


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
    item = {"id": item_id, "type": "reasoning", "status": status, "summary": [], "content": content}
    return sealed(item) if text is not None and status == "completed" else item


def sealed(item: dict[str, Any]) -> dict[str, Any]:
    """A finished reasoning item with ``encrypted_content``: the reasoning, opaque, for the
    clients that send back only that field (Codex) — it is rendered back into the prompt."""
    text = "".join(part["text"] for part in item["content"])
    item["encrypted_content"] = encoded_reasoning(text)
    return item


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
    items = [reasoning_item(new_id("rs_"), reasoning)] if reasoning else []
    if content or not calls:
        items.append(message_item(new_id("msg_"), content))
    return items + [call_item(new_id("fc_"), call) for call in calls]


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
    echo: ResponseEcho,
    status: str,
    output: list[dict[str, Any]],
    state: ParsedChoice | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    req, sampling = echo.req, echo.sampling
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
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
        "store": req.store is not False,
        "temperature": sampling.temperature,
        "text": {
            "format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
        },
        "tool_choice": _tool_choice_echo(req.tool_choice),
        "tools": [tool.model_dump(exclude_none=True) for tool in req.function_tools()],
        "top_p": sampling.top_p,
        "truncation": "disabled",
        "usage": response_usage(state) if state is not None else None,
        "user": req.user,
        "metadata": req.metadata or {},
    }


def _tool_choice_echo(value: Any) -> Any:
    return "auto" if value is None else value
