"""OpenAI wire types: what clients send (validated strictly) and what we answer.

Requests are parsed from raw JSON bytes with pydantic in strict mode: wrong types are
errors (``"5"`` is not an integer), ranges are checked, NaN is refused, and nesting is
bounded by the JSON parser. Unknown fields are ignored, so clients written for other
servers keep working. Fields whose OpenAI type is a union (``stop``, ``prompt``,
``content``, ``tool_choice``) are validated by hand so an error names the parameter
(``stop``), not a pydantic union branch. ``image_url`` content parts are decoded while the
request is validated (:mod:`homelab.server.image_parts`, its limits in the validation
context), so a bad image is a 400 before anything else happens.

llama.cpp's slot and cache knobs (``id_slot``, ``cache_prompt``, ``n_keep``, ``n_discard``,
``cache_salt``…) are *not* fields here: they are dropped with the other unknown fields and
never reach the engine. The tenant comes only from the API key.

Response models document the responses (OpenAPI); the routes build the same shapes as
plain dicts for speed, and the tests check real responses against these models.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from homelab.server.image_parts import check_image_count, count_typed_parts, image_from_url

MAX_STOP_STRINGS = 4
MAX_STOP_LENGTH = 256
MAX_TOP_LOGPROBS = 20
MAX_TOOLS = 128
MAX_LOGIT_BIAS_ENTRIES = 1024
INT64_MAX = 2**63 - 1

IGNORED_LLAMACPP_FIELDS = (
    "id_slot",
    "slot_id",
    "cache_prompt",
    "cache_salt",
    "n_keep",
    "n_discard",
    "n_cache_reuse",
    "lora",
)


class WireModel(BaseModel):
    """The base of every request wire type, in every dialect: strict types, no NaN, unknown
    fields ignored (clients written for other servers keep working)."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


# --- request parts -------------------------------------------------------------------------


class TextPart(WireModel):
    type: Literal["text"]
    text: str


class FunctionCall(WireModel):
    name: str
    arguments: str = "{}"


class ToolCall(WireModel):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


ImageUrlJson = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": ["image_url"]},
        "image_url": {
            "type": "object",
            "properties": {"url": {"type": "string"}, "detail": {"type": "string"}},
            "required": ["url"],
        },
    },
    "required": ["type", "image_url"],
}
ContentJson = WithJsonSchema(
    {
        "anyOf": [
            {"type": "string"},
            {
                "type": "array",
                "items": {"anyOf": [{"$ref": "#/components/schemas/TextPart"}, ImageUrlJson]},
            },
            {"type": "null"},
        ]
    }
)


def _content_or_calls(schema: dict[str, Any]) -> None:
    """The document says what ``ChatMessage._content_present`` checks: every message has
    content (not null), but an assistant's that carries tool calls."""
    properties = schema.pop("properties")
    schema.pop("required", None)
    content = {"anyOf": [s for s in properties["content"]["anyOf"] if s != {"type": "null"}]}
    calls = next(s for s in properties["tool_calls"]["anyOf"] if s.get("type") == "array")
    with_content = {
        "properties": properties | {"content": content},
        "required": ["role", "content"],
    }
    assistant_calls = properties | {
        "role": {"enum": ["assistant"]},
        "tool_calls": calls | {"minItems": 1},
    }
    schema["anyOf"] = [
        with_content,
        {"properties": assistant_calls, "required": ["role", "tool_calls"]},
    ]


class ChatMessage(WireModel):
    model_config = ConfigDict(json_schema_extra=_content_or_calls)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[Any, ContentJson] = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an assistant turn's thinking, as we returned it
    reasoning: str | None = None  # the same under the name some clients use (OpenRouter's)

    @field_validator("content")
    @classmethod
    def _content_parts(cls, value: Any, info: ValidationInfo) -> str | list[dict[str, Any]] | None:
        """Text parts are joined into one string; with images, the parts stay in order
        (``{"type": "text", "text": ...}``, ``{"type": "image", "image": DecodedImage}``)."""
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError("content must be a string or a list of text and image_url parts")
        role = info.data.get("role", "")
        parts = [_part(part, role, info.context) for part in value]
        if all(part["type"] == "text" for part in parts):
            return "".join(part["text"] for part in parts)
        return parts

    @model_validator(mode="after")
    def _content_present(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a '{self.role}' message needs content")
        return self

    def text(self) -> str:
        """The text of the content (an image's place left out)."""
        if isinstance(self.content, list):
            return "".join(part["text"] for part in self.content if part["type"] == "text")
        return self.content if isinstance(self.content, str) else ""

    def template_content(self) -> str | list[dict[str, Any]]:
        """The content as the chat template path takes it: a string, or text and image parts."""
        return self.content if isinstance(self.content, list) else self.text()


def _part(part: Any, role: str, context: Any) -> dict[str, Any]:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise ValueError("each content part must be an object with a 'type'")
    if part["type"] == "image_url":
        if role != "user":
            raise ValueError(f"images go in user messages, not in a '{role}' message")
        return {"type": "image", "image": image_from_url(_image_url(part), context)}
    if part["type"] != "text":
        raise ValueError(
            f"content parts of type '{part['type']}' are not supported (text and image_url)"
        )
    if not isinstance(part.get("text"), str):
        raise ValueError("a text content part needs a string 'text'")
    return {"type": "text", "text": str(part["text"])}


def _image_url(part: dict[str, Any]) -> str:
    """The URL of ``{"type": "image_url", "image_url": {"url": ..., "detail": ...}}`` (a bare
    string ``image_url`` is accepted too, as some clients send it)."""
    image_url = part.get("image_url")
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if not isinstance(url, str) or not url:
        raise ValueError(
            'an image_url part needs "image_url": {"url": "data:image/...;base64,..."}'
        )
    return url


class FunctionDefinition(WireModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(WireModel):
    type: Literal["function"]
    function: FunctionDefinition


class StreamOptions(WireModel):
    include_usage: bool = False


class JsonSchemaFormat(WireModel):
    name: str = Field(default="response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(WireModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_present(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema' object")
        return self


ToolChoiceJson = WithJsonSchema(
    {
        "anyOf": [
            {"type": "string", "enum": ["none", "auto", "required"]},
            {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": ["function"]},
                    "function": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}},
                        "required": ["name"],
                    },
                },
                "required": ["type", "function"],
            },
            {"type": "null"},
        ]
    }
)
StopJson = WithJsonSchema(
    {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP_STRINGS},
            {"type": "null"},
        ]
    }
)
PromptJson = WithJsonSchema(
    {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "minItems": 1},
            {"type": "array", "items": {"type": "integer"}, "minItems": 1},
            {
                "type": "array",
                "items": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
                "minItems": 1,
            },
        ]
    }
)


# --- requests ------------------------------------------------------------------------------


class SamplingRequest(WireModel):
    """Fields shared by chat and text completions, in OpenAI's order."""

    model: str
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=INT64_MAX)
    n: int = Field(default=1, ge=1, le=128)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    stop: Annotated[Any, StopJson] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    user: str | None = None
    # widely used extensions (llama.cpp, vLLM)
    top_k: int | None = Field(default=None, ge=0, le=INT64_MAX)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    ignore_eos: bool = False  # benchmark clients (vLLM's, llama.cpp's, genai-perf) send it
    min_tokens: int = Field(default=0, ge=0, le=INT64_MAX)  # vLLM: no end of text before

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: Any) -> tuple[str, ...]:
        stops = [value] if isinstance(value, str) else value
        if value is None:
            return ()
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ValueError("stop must be a string or a list of strings")
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        if any(len(s) > MAX_STOP_LENGTH for s in stops):
            raise ValueError(f"a stop string may be at most {MAX_STOP_LENGTH} characters")
        return tuple(s for s in stops if s)

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(
        cls, value: StreamOptions | None, info: ValidationInfo
    ) -> StreamOptions | None:
        if value is not None and info.data.get("stream") is False:  # as OpenAI: a 400
            raise ValueError("stream_options is only allowed when stream is true")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        if len(value) > MAX_LOGIT_BIAS_ENTRIES:
            raise ValueError(f"at most {MAX_LOGIT_BIAS_ENTRIES} entries are allowed")
        for token, bias in value.items():
            if not token.isascii() or not token.isdigit():
                raise ValueError(f"keys must be token ids (non-negative integers), got {token!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError("bias values must be between -100 and 100")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        return self.stop if isinstance(self.stop, tuple) else ()

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT64_MAX)
    response_format: ResponseFormat | None = None
    tools: list[ToolDefinition] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Annotated[Any, ToolChoiceJson] = None
    parallel_tool_calls: bool | None = None
    # reasoning models (OpenAI's reasoning_effort; llama.cpp/vLLM's template kwargs and format)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_format: Literal["auto", "deepseek", "none"] | None = None

    @field_validator("messages", mode="before")
    @classmethod
    def _image_count(cls, value: Any, info: ValidationInfo) -> Any:
        check_image_count(
            count_typed_parts(value, "image_url"), info.context
        )  # before any is decoded
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else checked_template_kwargs(value)

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: Any) -> str | None:
        """Normalized to "none", "auto", "required" or "function:NAME"."""
        if value is None or value in ("none", "auto", "required"):
            return value  # type: ignore[no-any-return]
        function = value.get("function") if isinstance(value, dict) else None
        if isinstance(function, dict) and value.get("type") == "function":
            name = function.get("name")
            if isinstance(name, str) and name:
                return f"function:{name}"
        raise ValueError(
            "tool_choice must be 'none', 'auto', 'required' or "
            '{"type": "function", "function": {"name": ...}}'
        )

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return value

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(SamplingRequest):
    prompt: Annotated[Any, PromptJson]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=128)

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value: Any) -> list[str | tuple[int, ...]]:
        """Normalized to a list of prompts, each text or token ids."""
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and value:
            if all(isinstance(p, str) for p in value):
                return list(value)
            if all(is_token_id(t) for t in value):
                return [tuple(value)]
            if all(isinstance(p, list) and p and all(is_token_id(t) for t in p) for p in value):
                return [tuple(p) for p in value]
        raise ValueError(
            "prompt must be a string, a list of strings, a list of token ids "
            "or a list of lists of token ids (none empty)"
        )

    @field_validator("logprobs")
    @classmethod
    def _no_echo_with_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("echo"):
            raise ValueError("echo together with logprobs is not supported")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix (fill-in-the-middle) is not supported by this server")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value != info.data.get("n", 1):
            raise ValueError("best_of is not supported (it may only equal n)")
        return value

    def prompts(self) -> list[str | tuple[int, ...]]:
        return self.prompt if isinstance(self.prompt, list) else []


MAX_TEMPLATE_KWARGS = 16
MAX_TEMPLATE_KWARG_CHARS = 4096
TEMPLATE_KWARG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
RESERVED_TEMPLATE_NAMES = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "documents"}
)


def checked_template_kwargs(value: dict[str, Any]) -> dict[str, Any]:
    """Extra chat-template variables: a few named scalars (or short lists of them); never the
    variables the server sets itself (messages, tools, special tokens)."""
    if len(value) > MAX_TEMPLATE_KWARGS:
        raise ValueError(f"at most {MAX_TEMPLATE_KWARGS} template variables are allowed")
    for name, item in value.items():
        if not TEMPLATE_KWARG_NAME.match(name) or name in RESERVED_TEMPLATE_NAMES:
            raise ValueError(f"{name!r} cannot be set as a template variable")
        items = item if isinstance(item, list) else [item]
        if len(items) > MAX_TEMPLATE_KWARGS or not all(_is_scalar(i) for i in items):
            raise ValueError(f"{name!r} must be a string, number, boolean or a short list of them")
        if sum(len(i) for i in items if isinstance(i, str)) > MAX_TEMPLATE_KWARG_CHARS:
            raise ValueError(f"{name!r} is longer than {MAX_TEMPLATE_KWARG_CHARS} characters")
    if "enable_thinking" in value and not isinstance(value["enable_thinking"], bool):
        raise ValueError("enable_thinking must be true or false")
    return value


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | bool | int | float)


def is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- responses (documentation and test oracle) ---------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int  # generated inside the reasoning (models that think)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobEntry] | None


class ResponseMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    reasoning_content: str | None = None  # models that think: the reasoning, apart
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ResponseMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"]
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorBody


REQUEST_MODELS: tuple[type[BaseModel], ...] = (ChatCompletionRequest, CompletionRequest, TextPart)


def body_doc(name: str) -> dict[str, Any]:
    """A route's ``openapi_extra``: its JSON body is the schema ``name`` (bodies are parsed by
    hand from raw bytes, so FastAPI cannot see them)."""
    schema = {"$ref": f"#/components/schemas/{name}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def small_body_doc(required: tuple[str, ...] = (), **types: str) -> dict[str, Any]:
    """``openapi_extra`` of an admin route whose small JSON body is read by hand: its fields
    and their JSON types (``model="string"``), the ``required`` ones first."""
    properties = {name: {"type": kind} for name, kind in types.items()}
    schema = {"type": "object", "properties": properties, "required": list(required)}
    content = {"application/json": {"schema": schema}}
    return {"requestBody": {"required": bool(required), "content": content}}
