"""OpenAI Responses API wire types (``POST /v1/responses``) and their validation.

A Responses request is validated here (strict, unknown fields ignored, as in
:mod:`homelab.server.protocol`); its ``input_image`` parts are decoded while it is validated.
:func:`homelab.server.responses.chat_inputs` maps it to the one chat preparation.
``encrypted_content`` of reasoning items is this server's own opaque form of the reasoning
(:func:`encoded_reasoning`, :func:`decoded_reasoning`).

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
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from homelab.images.decoded import DecodedImage
from homelab.server.image_parts import (
    check_image_count,
    decoded_images,
    image_from_url,
)
from homelab.server.protocol import INT64_MAX, MAX_TOOLS, WireModel

MAX_METADATA_ENTRIES = 16
ENCRYPTED_PREFIX = "homelab-reasoning-v1:"
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
    input: Annotated[Any, InputJson]  # a string or a list of items (responses.chat_inputs)
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

    @property
    def images_by_url(self) -> dict[str, DecodedImage]:
        """The ``input_image`` parts decoded while this request was validated, by URL."""
        return self._images


# --- input parts read while validating; the reasoning codec ----------------------------------


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
