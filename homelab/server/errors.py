"""One error envelope for every failure the server reports, in OpenAI's shape.

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}

(Anthropic's on ``/v1/messages``, Ollama's ``{"error": "..."}`` on ``/api/``:
:meth:`ApiError.envelope_for`.)

Everything that goes wrong while handling a request ends up as an :class:`ApiError`:
validation problems are raised as ``ApiError`` directly, and :func:`api_error_from` maps
our :mod:`homelab.errors` types (and anything unexpected) to one. Unexpected exceptions
become a 500 with a generic message: exception text and paths never reach a client.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from homelab.errors import (
    BusyError,
    ContextLengthError,
    EngineClosedError,
    EngineError,
    HomelabError,
)

log = logging.getLogger("homelab.server")

# HTTP status -> OpenAI error "type"
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}

# HTTP status -> Anthropic error "type" (the Messages API's envelope, on its routes only)
ANTHROPIC_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
ANTHROPIC_PATH_PREFIX = "/v1/messages"
OLLAMA_PATH_PREFIX = "/api/"  # Ollama's routes: errors as {"error": "..."}

GENERIC_500_MESSAGE = "The server had an error while processing your request."


def speaks_anthropic(path: str) -> bool:
    """Whether errors on ``path`` take Anthropic's envelope (``/v1/messages`` and below)."""
    return path == ANTHROPIC_PATH_PREFIX or path.startswith(ANTHROPIC_PATH_PREFIX + "/")


def speaks_ollama(path: str) -> bool:
    """Whether errors on ``path`` take Ollama's envelope (``/api/...``)."""
    return path.startswith(OLLAMA_PATH_PREFIX)


@dataclass
class ApiError(Exception):
    """A failure with the HTTP status and the fields of the OpenAI error envelope."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def type(self) -> str:
        return ERROR_TYPES.get(self.status, "invalid_request_error")

    def envelope(self) -> dict[str, Any]:
        body = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return {"error": body}

    @property
    def anthropic_type(self) -> str:
        default = "api_error" if self.status >= 500 else "invalid_request_error"
        return ANTHROPIC_ERROR_TYPES.get(self.status, default)

    def anthropic_envelope(self) -> dict[str, Any]:
        """``{"type": "error", "error": {"type": ..., "message": ...}}``"""
        return {"type": "error", "error": {"type": self.anthropic_type, "message": self.message}}

    def ollama_envelope(self) -> dict[str, Any]:
        """``{"error": "..."}``: Ollama's whole envelope (its clients read only the text)."""
        return {"error": self.message}

    def envelope_for(self, path: str) -> dict[str, Any]:
        """The envelope of the dialect the route at ``path`` speaks."""
        if speaks_anthropic(path):
            return self.anthropic_envelope()
        return self.ollama_envelope() if speaks_ollama(path) else self.envelope()

    def json_bytes(self, path: str = "") -> bytes:
        return json.dumps(self.envelope_for(path)).encode()


def invalid_request(
    message: str, param: str | None = None, code: str = "invalid_value"
) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def context_length_exceeded(prompt_tokens: int, max_tokens: int, n_ctx: int) -> ApiError:
    message = (
        f"This model's context per request is {n_ctx} tokens, but {prompt_tokens} prompt tokens "
        f"plus {max_tokens} completion tokens were requested. Shorten the prompt or lower "
        "max_tokens."
    )
    return ApiError(400, message, param="messages", code="context_length_exceeded")


def prompt_too_long(n_ctx: int, detail: str) -> ApiError:
    """The prompt alone cannot fit (found before tokenizing all of it: ``detail`` says how)."""
    message = (
        f"This model's context per request is {n_ctx} tokens, but {detail}. Shorten the prompt."
    )
    return ApiError(400, message, param="messages", code="context_length_exceeded")


def service_unavailable(message: str, code: str, retry_after_s: int = 1) -> ApiError:
    return ApiError(503, message, code=code, headers={"Retry-After": str(retry_after_s)})


def server_error() -> ApiError:
    return ApiError(500, GENERIC_500_MESSAGE, code="internal_error")


def api_error_from(exc: BaseException) -> ApiError:
    """The one mapping from exception types to HTTP statuses."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ValidationError):
        return api_error_from_validation(exc)
    if isinstance(exc, ContextLengthError):
        return ApiError(400, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, BusyError):
        return service_unavailable(
            "The server is at capacity (request queue full). Retry shortly.", code="queue_full"
        )
    if isinstance(exc, EngineClosedError):
        return service_unavailable("The server is shutting down.", code="shutting_down")
    if isinstance(exc, EngineError | HomelabError):
        log.error("request failed: %s: %s", type(exc).__name__, exc)
        return server_error()
    log.error("unexpected error while handling a request", exc_info=exc)
    return server_error()


def api_error_from_validation(exc: ValidationError) -> ApiError:
    """A 400 naming the first bad parameter the way OpenAI does (``messages[0].role``)."""
    first = exc.errors(include_url=False)[0]
    kind, loc, message = first["type"], first["loc"], first["msg"]
    if kind == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return invalid_request(
            f"The request body is not valid JSON ({detail}).", code="invalid_json"
        )
    message = message.removeprefix("Value error, ")
    if not loc and kind in ("model_type", "model_attributes_type", "dict_type"):
        return invalid_request("The request body must be a JSON object.", code="invalid_body")
    if not loc:
        return invalid_request(f"Invalid request: {message}", code="invalid_value")
    param = param_name(loc)
    if kind == "missing":
        return invalid_request(
            f"Missing required parameter: '{param}'.",
            param=param,
            code="missing_required_parameter",
        )
    return invalid_request(
        f"Invalid value for '{param}': {message}", param=param, code="invalid_value"
    )


def param_name(loc: tuple[int | str, ...]) -> str:
    """``("messages", 0, "role")`` -> ``"messages[0].role"``."""
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        else:
            name += f".{part}" if name else str(part)
    return name


def json_body_name(raw: bytes, field: str, what: str) -> str:
    """The non-empty string ``field`` of an admin request's JSON body, or a 400 saying
    ``what`` to name (``{"model": NAME}``)."""
    try:
        document = json.loads(raw or b"{}")
    except ValueError:
        raise invalid_request("The body is not valid JSON.") from None
    value = document.get(field) if isinstance(document, dict) else None
    if not isinstance(value, str) or not value:
        raise invalid_request(f'Say {what}: {{"{field}": NAME}}.', param=field)
    return value
