"""Ollama's wire types (``/api/chat``, ``/api/generate``, ``/api/embed``, ``/api/show``…),
validated as strictly as the OpenAI ones (:class:`~homelab.server.protocol.WireModel`): wrong
types are errors, NaN is refused, unknown fields are ignored (Ollama's load-time options such
as ``num_gpu`` or ``use_mmap`` mean nothing here: the plan decided them).

Images come as bare base64 strings (``images: ["iVBOR..."]``), decoded while the request is
validated under the request's limits (:mod:`homelab.server.image_parts`), so a bad image is a
400 before anything else happens. Tool calls carry their arguments as a JSON object, not as
text. Errors on these routes take Ollama's envelope, ``{"error": "..."}``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from homelab.server.image_parts import check_image_count, image_from_base64
from homelab.server.protocol import (
    INT64_MAX,
    MAX_STOP_LENGTH,
    MAX_TOOLS,
    ToolDefinition,
    WireModel,
)

MAX_OLLAMA_STOPS = 16
THINK_LEVELS = ("low", "medium", "high")
DURATION = re.compile(r"^\s*-?\d+(?:\.\d+)?\s*(?:ms|s|m|h)?\s*$")


def _keep_alive(value: Any) -> Any:
    """A duration as Ollama takes it (``10m``, ``30s``, seconds, ``0``, ``-1``); the fleet
    reads it (``app.serving_context``), a server of one model keeps its model anyway."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    if isinstance(value, str) and DURATION.match(value):
        return value
    raise ValueError("keep_alive must be a duration such as 10m, 30s, 0 or -1")


FormatJson = WithJsonSchema(
    {"anyOf": [{"type": "string", "enum": ["", "json"]}, {"type": "object"}, {"type": "null"}]}
)
ThinkJson = WithJsonSchema(
    {
        "anyOf": [
            {"type": "boolean"},
            {"type": "string", "enum": list(THINK_LEVELS)},
            {"type": "null"},
        ]
    }
)
KeepAliveJson = WithJsonSchema(
    {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "null"}]}
)
KeepAlive = Annotated[Any, AfterValidator(_keep_alive), KeepAliveJson]
ImagesJson = WithJsonSchema(
    {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]}
)
EmbedInputJson = WithJsonSchema(
    {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}
)


class OllamaOptions(WireModel):
    """The runtime ``options`` homelab applies (the others are accepted and ignored)."""

    num_ctx: int | None = Field(default=None, ge=1, le=INT64_MAX)
    num_predict: int | None = Field(default=None, ge=-2, le=INT64_MAX)  # -1: no limit; -2: fill
    temperature: float | None = Field(default=None, ge=0.0, le=100.0)
    top_k: int | None = Field(default=None, ge=0, le=INT64_MAX)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    stop: list[str] | None = Field(default=None, max_length=MAX_OLLAMA_STOPS)
    repeat_penalty: float | None = Field(default=None, ge=0.0, le=10.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(len(s) > MAX_STOP_LENGTH for s in value):
            raise ValueError(f"a stop string may be at most {MAX_STOP_LENGTH} characters")
        return value

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, value: float | None) -> float | None:
        return None if value == 0.0 else value  # Ollama's 0: the default (no cut)


class OllamaFunctionCall(WireModel):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)  # an object, not JSON text


class OllamaToolCall(WireModel):
    id: str | None = None
    function: OllamaFunctionCall


def _images(value: Any, info: ValidationInfo) -> list[Any] | None:
    """Base64 strings -> decoded images (the request's limits from the context)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError("images must be a list of base64 strings")
    return [image_from_base64(item, None, info.context) for item in value]


class OllamaMessage(WireModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None  # left out (or null) beside images or tool calls: empty
    thinking: str | None = None
    images: Annotated[Any, ImagesJson] = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None

    @field_validator("images")
    @classmethod
    def _decoded(cls, value: Any, info: ValidationInfo) -> list[Any] | None:
        if value and info.data.get("role") != "user":
            raise ValueError(f"images go in user messages, not in a '{info.data.get('role')}' one")
        return _images(value, info)


class _OllamaGeneration(WireModel):
    """What ``/api/chat`` and ``/api/generate`` share."""

    model: str = Field(min_length=1)
    format: Annotated[Any, FormatJson] = None
    options: OllamaOptions | None = None
    stream: bool = True  # Ollama streams unless told not to
    keep_alive: KeepAlive = None  # read by the fleet (app.serving_context)
    think: Annotated[Any, ThinkJson] = None

    @field_validator("format")
    @classmethod
    def _format(cls, value: Any) -> str | dict[str, Any] | None:
        if value is None or value == "" or value == "json" or isinstance(value, dict):
            return value or None
        raise ValueError('format must be "json" or a JSON schema (an object)')

    @field_validator("think")
    @classmethod
    def _think(cls, value: Any) -> bool | str | None:
        if value is None or isinstance(value, bool) or value in THINK_LEVELS:
            return value  # type: ignore[no-any-return]
        raise ValueError('think must be true, false, "low", "medium" or "high"')

    def sampling_options(self) -> OllamaOptions:
        return self.options or OllamaOptions()


class OllamaChatRequest(_OllamaGeneration):
    messages: list[OllamaMessage] = Field(default_factory=list)  # none: load the model only
    tools: list[ToolDefinition] | None = Field(default=None, max_length=MAX_TOOLS)

    @field_validator("messages", mode="before")
    @classmethod
    def _image_count(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, list):
            count = sum(
                len(m["images"])
                for m in value
                if isinstance(m, dict) and isinstance(m.get("images"), list)
            )
            check_image_count(count, info.context)  # before any is decoded
        return value


class OllamaGenerateRequest(_OllamaGeneration):
    prompt: str = ""  # empty: load the model only
    system: str | None = None
    suffix: str | None = None
    template: str | None = None
    raw: bool = False
    context: list[int] | None = None
    images: Annotated[Any, ImagesJson] = None

    @field_validator("images")
    @classmethod
    def _decoded(cls, value: Any, info: ValidationInfo) -> list[Any] | None:
        if isinstance(value, list):
            check_image_count(len(value), info.context)
        return _images(value, info)

    @model_validator(mode="after")
    def _supported(self) -> OllamaGenerateRequest:
        if self.suffix:
            raise ValueError("suffix (fill-in-the-middle) is not supported by this server")
        if self.template:
            raise ValueError(
                "template is not supported: the model's own chat template renders the prompt "
                "(send raw: true with a prompt you formatted yourself)"
            )
        if self.context:
            raise ValueError(
                "context (token ids of an earlier /api/generate) is not supported; "
                "send the conversation to /api/chat"
            )
        if self.raw and self.images:
            raise ValueError("images need the chat template: leave raw unset")
        return self


class OllamaEmbedRequest(WireModel):
    model: str = Field(min_length=1)
    input: Annotated[Any, EmbedInputJson]
    truncate: bool = True  # an input longer than the model takes is cut at its end (else: 400)
    dimensions: int | None = Field(default=None, ge=1, le=INT64_MAX)
    keep_alive: KeepAlive = None

    @field_validator("input")
    @classmethod
    def _inputs(cls, value: Any) -> list[str]:
        inputs = [value] if isinstance(value, str) else value
        if (
            not isinstance(inputs, list)
            or not inputs
            or not all(isinstance(s, str) for s in inputs)
        ):
            raise ValueError("input must be a string or a non-empty list of strings")
        if not all(inputs):
            raise ValueError("input strings must not be empty")
        return inputs

    def texts(self) -> list[str]:
        return list(self.input)


class OllamaEmbeddingsRequest(WireModel):
    """The older ``/api/embeddings``: one ``prompt``, one ``embedding`` back."""

    model: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    keep_alive: KeepAlive = None


class OllamaModelRequest(WireModel):
    """``/api/show`` and ``/api/pull``: ``model`` (older clients send ``name``)."""

    model: str | None = None
    name: str | None = None
    verbose: bool = False
    stream: bool = True  # /api/pull's progress lines

    @model_validator(mode="after")
    def _named(self) -> OllamaModelRequest:
        if not (self.model or self.name):
            raise ValueError('name the model: {"model": NAME}')
        return self

    @property
    def model_name(self) -> str:
        return self.model or self.name or ""


OLLAMA_REQUEST_MODELS: tuple[type[WireModel], ...] = (
    OllamaChatRequest,
    OllamaGenerateRequest,
    OllamaEmbedRequest,
    OllamaEmbeddingsRequest,
    OllamaModelRequest,
)
