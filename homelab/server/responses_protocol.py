"""OpenAI Responses API wire types (``POST /v1/responses``), and their translation to chat.

A Responses request is validated here (strict, unknown fields ignored, as in
:mod:`homelab.server.protocol`) and then turned into the :class:`ChatCompletionRequest` it
means — instructions as a system message, input items as chat messages, function tools,
``tool_choice`` and ``text.format`` in their chat shapes — so everything after that (model
name, template, tools, JSON-schema grammar, context and token limits, sampling) is the chat
route's one path. Errors found in translation name the Responses parameter
(``input[2].content[0].type``).

Reasoning items in ``input`` open the assistant turn they belong to as its
``reasoning_content`` (rendered back where the template allows, for the prefix cache).
``store`` and ``previous_response_id`` are served by :mod:`homelab.server.response_store`
(per tenant, bounded); ``background: true``, ``conversation``, stored ``prompt`` templates
and ``item_reference`` input items are refused with a 400 that says so.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from homelab.images.decoded import DecodedImage
from homelab.server.errors import ApiError, api_error_from_validation, invalid_request
from homelab.server.image_parts import (
    ImagePolicy,
    check_image_count,
    decoded_images,
    image_context,
    image_from_url,
)
from homelab.server.protocol import INT64_MAX, MAX_TOOLS, ChatCompletionRequest, WireModel

MAX_METADATA_ENTRIES = 16
ENCRYPTED_PREFIX = "homelab-reasoning-v1:"
TEXT_PART_TYPES = frozenset({"input_text", "output_text", "text"})
InputJson = WithJsonSchema(
    {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "object"}, "minItems": 1},
        ]
    }
)
ToolChoiceJson = WithJsonSchema(
    {
        "anyOf": [
            {"type": "string", "enum": ["none", "auto", "required"]},
            {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": ["function"]},
                    "name": {"type": "string"},
                },
                "required": ["type", "name"],
            },
            {"type": "null"},
        ]
    }
)
STATELESS = (
    "this server keeps responses only for previous_response_id; send the whole conversation, "
    "earlier outputs included, in 'input'"
)


class FunctionTool(WireModel):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


def _hosted(tool: Any) -> bool:
    """A tool of a type this server cannot run (``web_search``, ``local_shell``, ``custom``,
    ``namespace``…): left out of the prompt, with a warning (see responses)."""
    return (
        isinstance(tool, dict) and isinstance(tool.get("type"), str) and tool["type"] != "function"
    )


class TextFormat(WireModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str = Field(default="response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_present(self) -> TextFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("a json_schema format needs a 'schema'")
        return self


class TextConfig(WireModel):
    format: TextFormat | None = None


class ReasoningConfig(WireModel):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None


class ResponsesRequest(WireModel):
    """The fields of ``POST /v1/responses`` this server reads (others are ignored)."""

    model: str
    input: Annotated[Any, InputJson]  # a string or a list of items, see chat_request
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=INT64_MAX)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    tools: list[FunctionTool] | None = Field(default=None, max_length=MAX_TOOLS)
    ignored_tool_types: SkipJsonSchema[list[str]] = Field(default=[], exclude=True)  # ours
    tool_choice: Annotated[Any, ToolChoiceJson] = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(default=None, ge=0, le=INT64_MAX)
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None  # accepted; reasoning items always carry encrypted_content
    store: bool | None = None  # None: stored, as OpenAI does by default
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=256)
    # what needs state this server does not keep: refused (see the module docstring)
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    _images: dict[str, DecodedImage] = PrivateAttr(default_factory=dict)  # by URL

    @field_validator("input")
    @classmethod
    def _images_decoded(cls, value: Any, info: ValidationInfo) -> Any:
        """Every ``input_image`` decoded now (a bad one is a 400 before anything else)."""
        parts = list(image_parts(value))
        check_image_count(len(parts), info.context)
        for where, part in parts:
            try:
                image_from_url(input_image_url(part), info.context)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        return value

    @model_validator(mode="after")
    def _keep_images(self, info: ValidationInfo) -> ResponsesRequest:
        self._images = decoded_images(info.context)
        return self

    @field_validator("background")
    @classmethod
    def _no_background(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError(f"background: true is not supported: {STATELESS}")
        return value

    @field_validator("conversation")
    @classmethod
    def _no_conversation(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError(f"conversation is not supported: {STATELESS}")
        return value

    @field_validator("prompt")
    @classmethod
    def _no_prompt(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("stored prompt templates are not supported; send the text itself")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata_bounded(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and len(value) > MAX_METADATA_ENTRIES:
            raise ValueError(f"at most {MAX_METADATA_ENTRIES} metadata entries are allowed")
        return value

    @model_validator(mode="before")
    @classmethod
    def _set_hosted_tools_aside(cls, data: Any) -> Any:
        """Function tools stay; the types of the others are kept to warn about them."""
        if not isinstance(data, dict):
            return data
        tools = data.get("tools")
        data = {k: v for k, v in data.items() if k != "ignored_tool_types"}
        if isinstance(tools, list) and any(_hosted(t) for t in tools):
            data["tools"] = [t for t in tools if not _hosted(t)]
            data["ignored_tool_types"] = sorted({t["type"] for t in tools if _hosted(t)})
        return data

    def function_tools(self) -> list[FunctionTool]:
        return list(self.tools or [])


# --- translation to chat --------------------------------------------------------------------


def image_parts(value: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, part) of each ``input_image`` part of the messages in ``input``."""
    for i, item in enumerate(value if isinstance(value, list) else []):
        content = item.get("content") if isinstance(item, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and part.get("type") == "input_image":
                yield f"input[{i}].content[{j}]", part


def input_image_url(part: dict[str, Any]) -> str:
    """The URL of ``{"type": "input_image", "image_url": ...}``; ``file_id`` is refused."""
    url = part.get("image_url")
    if isinstance(url, str) and url:
        return url
    if part.get("file_id") is not None:
        raise ValueError(
            "file_id images need the Files API, which this server does not have; "
            "send image_url as a data URL (data:image/png;base64,...)"
        )
    raise ValueError("an input_image needs an image_url (data:image/png;base64,...)")


def chat_request(req: ResponsesRequest, policy: ImagePolicy | None = None) -> ChatCompletionRequest:
    """The chat request ``req`` stands for (raises ApiError naming the Responses parameter);
    its images are those decoded when ``req`` was parsed (earlier responses' ones under
    ``policy``)."""
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages(req.instructions, req.input),
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tool_choice": tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
    }
    if req.function_tools():
        body["tools"] = [chat_tool(tool) for tool in req.function_tools()]
    fmt = req.text.format if req.text else None
    if fmt is not None:
        body["response_format"] = response_format(fmt)
    try:
        context = image_context(policy or ImagePolicy(), req._images)
        return ChatCompletionRequest.model_validate(body, context=context)
    except ValidationError as exc:
        error = api_error_from_validation(exc)
        raise invalid_request(error.message, param="input") from None


def chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function = tool.model_dump(exclude_none=True, exclude={"type"})
    return {"type": "function", "function": function}


def response_format(fmt: TextFormat) -> dict[str, Any]:
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    schema = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}
    return {"type": "json_schema", "json_schema": schema}


def tool_choice(value: Any) -> Any:
    """Responses' ``tool_choice`` in chat's shape (``{"type": "function", "name": ...}`` moves
    the name under ``function``)."""
    if value is None or value in ("none", "auto", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        name = value.get("name")
        if isinstance(name, str) and name:
            return {"type": "function", "function": {"name": name}}
    raise invalid_request(
        "tool_choice must be 'none', 'auto', 'required' or "
        '{"type": "function", "name": ...} (only function tools are supported).',
        param="tool_choice",
    )


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
    this server returned (the reasoning itself, see :func:`encoded_reasoning`), else its
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


def encoded_reasoning(text: str) -> str:
    """What ``include: ["reasoning.encrypted_content"]`` gets: not encrypted (the reasoning is
    the client's own output) but opaque, so clients that send back only this field (Codex)
    give the reasoning back for the prompt."""
    return ENCRYPTED_PREFIX + base64.b64encode(text.encode()).decode("ascii")


def decoded_reasoning(value: str) -> str:
    """The text :func:`encoded_reasoning` made, or "" (another server's encrypted content)."""
    if not value.startswith(ENCRYPTED_PREFIX):
        return ""
    try:
        return base64.b64decode(value[len(ENCRYPTED_PREFIX) :], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return ""


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise invalid_request(
            f"{where}.role must be 'user', 'assistant', 'system' or 'developer'.",
            param=f"{where}.role",
        )
    return {
        "role": "system" if role == "developer" else role,
        "content": _content(item.get("content"), f"{where}.content"),
    }


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
