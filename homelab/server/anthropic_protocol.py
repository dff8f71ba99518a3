"""Anthropic Messages API wire types: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

Parsed like the OpenAI types (:mod:`homelab.server.protocol`): strict pydantic from raw
bytes, unknown fields ignored (``metadata``, ``cache_control``, ``service_tier``, beta
fields…), errors naming the parameter. Content may be a string or a list of blocks; blocks
are validated one by one so an error says which block is wrong and why:

- ``user`` messages hold ``text``, ``image`` and ``tool_result`` blocks (an image's ``base64``
  source is decoded here, see :mod:`homelab.server.image_parts`; a ``url`` source only where
  the server fetches URLs);
- ``assistant`` messages hold ``text``, ``tool_use``, ``thinking`` and ``redacted_thinking``;
- ``system`` messages (Claude Code's ``mid-conversation-system`` beta: operator text placed
  among the turns, e.g. its agent and skill lists after the first user message) hold ``text``;
- documents, citations, images inside tool results and Anthropic's server tools are refused
  with a 400.

The conversation rules the API enforces are checked here too: the first message is the
user's, only the final assistant message may be empty (it is then a prefill to continue),
and every ``tool_result`` answers a ``tool_use`` of the assistant message just before it.
Consecutive messages of the same role are allowed (the API joins them).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from homelab.engine.grammar import schema_depth
from homelab.images.decoded import DecodedImage
from homelab.server.image_parts import (
    check_image_count,
    count_typed_parts,
    image_from_base64,
    image_from_remote,
)
from homelab.server.protocol import INT64_MAX, MAX_TOOLS, WireModel

MAX_TOKENS_CEILING = 1 << 20  # more is refused; up to this, the context left clamps it
MAX_STOP_SEQUENCES = 16
MAX_STOP_SEQUENCE_CHARS = 256
MAX_TOOL_SCHEMA_DEPTH = 32  # JSON containers; real tool schemas nest a handful deep
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_\-]{1,128}$"


# --- content blocks --------------------------------------------------------------------------


class TextBlock(WireModel):
    type: Literal["text"]
    text: str = Field(json_schema_extra={"pattern": r"\S"})  # a blank one is refused


class ImageBlock(WireModel):
    """An image; ``source`` (``base64`` with ``media_type``, or ``url``) becomes its pixels."""

    type: Literal["image"]
    source: Any

    @field_validator("source")
    @classmethod
    def _decoded(cls, value: Any, info: ValidationInfo) -> DecodedImage:
        kind = value.get("type") if isinstance(value, dict) else None
        if kind == "base64":
            data, media_type = value.get("data"), value.get("media_type")
            if not isinstance(data, str) or not isinstance(media_type, str):
                raise ValueError("a base64 source needs string 'media_type' and 'data'")
            return image_from_base64(data, media_type, info.context)
        if kind == "url" and isinstance(value.get("url"), str):
            return image_from_remote(value["url"], info.context)
        if kind == "file":
            raise ValueError("file sources (the Files API) are not supported; send base64 data")
        raise ValueError(
            'source must be {"type": "base64", "media_type": ..., "data": ...} or '
            '{"type": "url", "url": ...}'
        )

    @property
    def image(self) -> DecodedImage:
        return self.source  # type: ignore[no-any-return]


class ToolUseBlock(WireModel):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    input: dict[str, Any]


class ToolResultBlock(WireModel):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: Any = None
    is_error: bool = False

    @field_validator("content")
    @classmethod
    def _result_text(cls, value: Any) -> str:
        if value is None or isinstance(value, str):
            return value or ""
        if not isinstance(value, list):
            raise ValueError("a tool_result's content must be a string or a list of text blocks")
        return _joined_text(value)


class ThinkingBlock(WireModel):
    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(WireModel):
    type: Literal["redacted_thinking"]
    data: str = ""


Block = (
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)
BLOCK_TYPES: dict[str, type[WireModel]] = {
    "text": TextBlock,
    "image": ImageBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
    "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
}
ROLE_BLOCKS = {
    "system": ("text",),
    "user": ("text", "image", "tool_result"),
    "assistant": ("text", "tool_use", "thinking", "redacted_thinking"),
}


def _parse_block(
    block: Any, index: int, allowed: tuple[str, ...], context: dict[str, Any] | None = None
) -> Block:
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str):
        raise ValueError(f"content block {index} must be an object with a string 'type'")
    if kind not in BLOCK_TYPES:
        raise ValueError(
            f"content block {index} has type '{kind}', which this server does not support "
            f"(it takes {', '.join(BLOCK_TYPES)})"
        )
    if kind not in allowed:
        raise ValueError(f"content block {index}: '{kind}' blocks are not allowed here")
    try:
        return BLOCK_TYPES[kind].model_validate(block, context=context)  # type: ignore[return-value]
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        detail = first["msg"].removeprefix("Value error, ")
        raise ValueError(f"content block {index} ({kind}): {where}: {detail}") from None


def _joined_text(blocks: list[Any]) -> str:
    """The text of a list that may hold only text blocks, one block per line."""
    parsed = [_parse_block(block, i, ("text",)) for i, block in enumerate(blocks)]
    return "\n".join(block.text for block in parsed if isinstance(block, TextBlock))


def _blocks_by_role(schema: dict[str, Any]) -> None:
    """The document says which blocks each role's content takes (``ROLE_BLOCKS``): one
    shape per role, its content a non-blank string or a list of those blocks."""
    schema.pop("properties")
    schema["anyOf"] = [
        {
            "properties": {
                "role": {"enum": [role]},
                "content": {
                    "anyOf": [
                        {"type": "string", "pattern": r"\S"},
                        {
                            "type": "array",
                            "minItems": 1,
                            "items": {"anyOf": [_block_ref(kind) for kind in kinds]},
                        },
                    ]
                },
            },
            "required": ["role", "content"],
        }
        for role, kinds in ROLE_BLOCKS.items()
    ]


def _block_ref(kind: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{BLOCK_TYPES[kind].__name__}"}


class MessageParam(WireModel):
    model_config = ConfigDict(json_schema_extra=_blocks_by_role)

    role: Literal["user", "assistant", "system"]
    content: Any

    @field_validator("content")
    @classmethod
    def _blocks(cls, value: Any, info: ValidationInfo) -> list[Block]:
        """Normalized to a list of blocks (a string is one text block)."""
        if isinstance(value, str):
            return [TextBlock(type="text", text=value)]
        if not isinstance(value, list):
            raise ValueError("content must be a string or a list of content blocks")
        allowed = ROLE_BLOCKS.get(info.data.get("role", ""), tuple(BLOCK_TYPES))
        return [_parse_block(block, i, allowed, info.context) for i, block in enumerate(value)]

    def blocks(self) -> list[Block]:
        return self.content if isinstance(self.content, list) else []

    def text(self) -> str:
        return "".join(b.text for b in self.blocks() if isinstance(b, TextBlock))


# --- tools, choices, thinking ---------------------------------------------------------------


class ToolParam(WireModel):
    type: str | None = None
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    input_schema: dict[str, Any]

    @field_validator("type")
    @classmethod
    def _custom_only(cls, value: str | None) -> str | None:
        if value not in (None, "custom"):
            raise ValueError(
                f"tools of type '{value}' (Anthropic's server tools) are not supported; "
                "define a custom tool with a name and an input_schema"
            )
        return value

    @field_validator("input_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("type") != "object":
            raise ValueError("input_schema must be a JSON schema with type 'object'")
        if schema_depth(value) > MAX_TOOL_SCHEMA_DEPTH:
            raise ValueError(f"input_schema is nested more than {MAX_TOOL_SCHEMA_DEPTH} levels")
        return value

    def as_function(self) -> dict[str, Any]:
        """The OpenAI-style tool the chat template and the grammar take."""
        function: dict[str, Any] = {"name": self.name, "parameters": self.input_schema}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


class ToolChoiceParam(WireModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoiceParam:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice of type 'tool' needs the tool's 'name'")
        return self


class ThinkingParam(WireModel):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(default=None, ge=1, le=INT64_MAX)  # accepted, not enforced
    display: Literal["summarized", "omitted"] | None = None

    def enable_thinking(self) -> bool | None:
        return {"enabled": True, "disabled": False}.get(self.type)


class OutputFormatParam(WireModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfigParam(WireModel):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormatParam | None = None

    def reasoning_effort(self) -> str | None:
        """As a template's ``reasoning_effort`` (gpt-oss knows low, medium and high)."""
        return (
            None
            if self.effort is None
            else {"xhigh": "high", "max": "high"}.get(self.effort, self.effort)
        )


# --- requests --------------------------------------------------------------------------------


class Conversation(WireModel):
    """What ``/v1/messages`` and ``/v1/messages/count_tokens`` share."""

    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: Any = None
    tools: list[ToolParam] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    output_config: OutputConfigParam | None = None

    @field_validator("messages", mode="before")
    @classmethod
    def _image_count(cls, value: Any, info: ValidationInfo) -> Any:
        check_image_count(count_typed_parts(value, "image"), info.context)  # before any is decoded
        return value

    @field_validator("system")
    @classmethod
    def _system_text(cls, value: Any) -> str | None:
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError("system must be a string or a list of text blocks")
        return _joined_text(value)

    @model_validator(mode="after")
    def _conversation(self) -> Conversation:
        check_turns(self.messages)
        names = {tool.name for tool in self.tools or []}
        choice = self.tool_choice
        if choice is not None and choice.type in ("any", "tool") and not names:
            raise ValueError(f"tool_choice '{choice.type}' needs tools")
        if choice is not None and choice.type == "tool" and choice.name not in names:
            raise ValueError(f"tool_choice names '{choice.name}', which is not in tools")
        forced = choice is not None and choice.type in ("any", "tool")
        if forced and self.output_config is not None and self.output_config.format is not None:
            raise ValueError("output_config.format cannot be combined with a forced tool_choice")
        return self

    def thinking_hidden(self) -> bool:
        return self.thinking is not None and self.thinking.display == "omitted"

    def system_text(self) -> str | None:
        return self.system if isinstance(self.system, str) else None


def check_turns(messages: list[MessageParam]) -> None:
    if messages[0].role != "user":
        raise ValueError("messages[0]: the first message must use the 'user' role")
    for index, message in enumerate(messages):
        final = index == len(messages) - 1
        if message.role == "assistant" and final:
            if any(isinstance(b, ToolUseBlock) for b in message.blocks()):
                raise ValueError(
                    f"messages[{index}]: the final assistant message cannot end in tool_use; "
                    "send the tool_result in a user message"
                )
            continue
        if not message.blocks():
            raise ValueError(f"messages[{index}]: content must not be empty")
        if any(isinstance(b, TextBlock) and not b.text.strip() for b in message.blocks()):
            raise ValueError(f"messages[{index}]: text content blocks must be non-empty")
        _check_results(messages, index)


def _check_results(messages: list[MessageParam], index: int) -> None:
    results = [b.tool_use_id for b in messages[index].blocks() if isinstance(b, ToolResultBlock)]
    if not results:
        return
    before = messages[index - 1] if index else None
    asked = {
        b.id
        for b in (before.blocks() if before and before.role == "assistant" else [])
        if isinstance(b, ToolUseBlock)
    }
    unknown = [tool_use_id for tool_use_id in results if tool_use_id not in asked]
    if unknown:
        raise ValueError(
            f"messages[{index}]: tool_result for '{unknown[0]}', which is not a tool_use id "
            "of the assistant message just before it"
        )


class MessagesRequest(Conversation):
    max_tokens: int = Field(ge=0, le=MAX_TOKENS_CEILING)  # 0: read the prompt (warm the cache)
    stop_sequences: list[str] | None = Field(default=None, max_length=MAX_STOP_SEQUENCES)
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=INT64_MAX)

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, value: list[str] | None) -> list[str] | None:
        if value and any(len(s) > MAX_STOP_SEQUENCE_CHARS for s in value):
            raise ValueError(f"a stop sequence may be at most {MAX_STOP_SEQUENCE_CHARS} characters")
        return value


class CountTokensRequest(Conversation):
    pass


# --- responses (documentation and test oracle) -----------------------------------------------


class MessageUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class ContentBlock(BaseModel):
    type: Literal["text", "thinking", "tool_use"]
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None


class MessageResponse(BaseModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[ContentBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None
    usage: MessageUsage


class MessageTokensCount(BaseModel):
    input_tokens: int


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    type: Literal["error"]
    error: AnthropicErrorDetail


REQUEST_MODELS: tuple[type[BaseModel], ...] = (MessagesRequest, CountTokensRequest)
