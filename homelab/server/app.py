"""The FastAPI application: routes, error handlers, the middleware stack, the OpenAPI document.

``create_app(engine_provider, config)`` serves one model. ``engine_provider()`` returns the
engine, or None while it is still loading (then ``/health`` and generation answer 503).
Request bodies are parsed by hand from raw bytes (see :mod:`homelab.server.protocol`), so
every malformed body gets the OpenAI error envelope with a 400, never FastAPI's 422.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from homelab.server import chat, completions, embeddings, responses
from homelab.server.auth import TenantLimiter
from homelab.server.config import ServerConfig
from homelab.server.errors import (
    ApiError,
    api_error_from,
    api_error_from_validation,
    service_unavailable,
)
from homelab.server.metrics import CONTENT_TYPE, ServerMetrics
from homelab.server.middleware import (
    TENANT_KEY,
    USAGE_KEY,
    BodyLimit,
    RequestObserver,
    RequestRecord,
    TenantGate,
)
from homelab.server.protocol import (
    REQUEST_MODELS,
    ChatCompletionRequest,
    CompletionRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from homelab.server.protocol import ChatCompletion as ChatCompletionResponse
from homelab.server.protocol import Completion as CompletionResponse
from homelab.server.responses_protocol import ResponsesRequest
from homelab.server.serving import EngineLike, RequestContext

NEW_DIALECT_MODELS: tuple[type[BaseModel], ...] = (ResponsesRequest, embeddings.EmbeddingRequest)

log = logging.getLogger("homelab.server")

EngineProvider = Callable[[], EngineLike | None]
RequestSubscriber = Callable[[RequestRecord], None]
Body = TypeVar("Body", bound=BaseModel)
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 403, 404, 413, 429, 500, 503)
}


class ServerState:
    """Per-app state the routes share (stored on ``app.state.homelab``)."""

    def __init__(self, engine_provider: EngineProvider, config: ServerConfig) -> None:
        self.engine_provider = engine_provider
        self.config = config
        self.metrics = ServerMetrics()
        self.limiter = TenantLimiter()
        self.subscribers: list[RequestSubscriber] = []
        self.started = int(time.time())

    def engine(self) -> EngineLike:
        engine = self.engine_provider()
        if engine is None:
            raise service_unavailable(
                "The model is still loading. Retry shortly.", code="model_loading", retry_after_s=5
            )
        return engine

    def subscribe(self, callback: RequestSubscriber) -> Callable[[], None]:
        self.subscribers.append(callback)
        return lambda: self.subscribers.remove(callback) if callback in self.subscribers else None


def create_app(engine_provider: EngineProvider, config: ServerConfig) -> FastAPI:
    app = FastAPI(
        title="homelab",
        summary="OpenAI-compatible endpoint for one local model",
        docs_url=None,
        redoc_url=None,
    )
    state = ServerState(engine_provider, config)
    app.state.homelab = state
    _add_routes(app, state)
    _add_error_handlers(app)
    _add_middleware(app, state)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def server_state(app: FastAPI) -> ServerState:
    return app.state.homelab  # type: ignore[no-any-return]


async def parse_body(request: Request, model: type[Body]) -> Body:
    try:
        raw = await request.body()
    except ClientDisconnect:  # gone mid-upload: nobody reads the answer, nothing to log
        raise ApiError(
            400, "The client disconnected during the upload.", code="client_disconnected"
        ) from None
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise api_error_from_validation(exc) from None


def _context(state: ServerState, request: Request) -> RequestContext:
    return RequestContext(
        engine=state.engine(),
        config=state.config,
        metrics=state.metrics,
        tenant=request.scope[TENANT_KEY],
        usage=request.scope.setdefault(USAGE_KEY, {}),
        http=request,
    )


def _body_doc(name: str) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{name}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health", responses={503: {"description": "the model is loading"}})
    async def health() -> JSONResponse:
        loaded = state.engine_provider() is not None
        return JSONResponse(
            {"status": "ok" if loaded else "loading"}, status_code=200 if loaded else 503
        )

    @app.get("/metrics", response_class=PlainTextResponse, responses=ERROR_RESPONSES)
    async def metrics() -> Response:
        engine = state.engine_provider()
        snapshot = engine.metrics() if engine is not None else None
        return Response(
            state.metrics.render(snapshot, state.config.model_id), media_type=CONTENT_TYPE
        )

    @app.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model}", response_model=ModelCard, responses=ERROR_RESPONSES)
    async def retrieve_model(model: str) -> JSONResponse:
        if not state.config.accepts_model(model):
            raise ApiError(
                404,
                f"The model '{model}' does not exist on this server.",
                param="model",
                code="model_not_found",
            )
        return JSONResponse(_model_card(state))

    @app.post(
        "/v1/chat/completions",
        response_model=ChatCompletionResponse,
        responses=ERROR_RESPONSES,
        openapi_extra=_body_doc("ChatCompletionRequest"),
    )
    async def chat_completions(request: Request) -> Response:
        body = await parse_body(request, ChatCompletionRequest)
        return await chat.chat_completion(_context(state, request), body)

    @app.post(
        "/v1/completions",
        response_model=CompletionResponse,
        responses=ERROR_RESPONSES,
        openapi_extra=_body_doc("CompletionRequest"),
    )
    async def text_completions(request: Request) -> Response:
        body = await parse_body(request, CompletionRequest)
        return await completions.text_completion(_context(state, request), body)

    @app.post(
        "/v1/responses", responses=ERROR_RESPONSES, openapi_extra=_body_doc("ResponsesRequest")
    )
    async def create_response(request: Request) -> Response:
        body = await parse_body(request, ResponsesRequest)
        return await responses.create_response(_context(state, request), body)

    @app.post(
        "/v1/embeddings", responses=ERROR_RESPONSES, openapi_extra=_body_doc("EmbeddingRequest")
    )
    async def create_embeddings(request: Request) -> Response:
        body = await parse_body(request, embeddings.EmbeddingRequest)
        return await embeddings.create_embeddings(_context(state, request), body)


def _model_card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.config.model_id,
        "object": "model",
        "created": state.started,
        "owned_by": "homelab",
    }


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.envelope(), status_code=error.status, headers=error.headers)


def _add_error_handlers(app: FastAPI) -> None:
    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        return _error_response(api_error_from(exc))

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        status = exc.status_code if isinstance(exc, StarletteHTTPException) else 500
        if status == 404:
            return _error_response(ApiError(404, "Unknown route.", code="unknown_route"))
        if status == 405:
            return _error_response(
                ApiError(405, "Method not allowed for this route.", code="method_not_allowed")
            )
        return _error_response(
            ApiError(status, "The request could not be handled.")
            if status < 500
            else api_error_from(exc)
        )

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        return _error_response(ApiError(400, "Invalid request parameters.", code="invalid_request"))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_api_error)  # 500 with a generic message


def _add_middleware(app: FastAPI, state: ServerState) -> None:
    config = state.config
    # add_middleware wraps: the last one added is the outermost
    app.add_middleware(BodyLimit, max_body_bytes=config.max_body_bytes)
    app.add_middleware(
        TenantGate,
        keys=config.keys,
        limiter=state.limiter,
        bound_to_loopback=config.bound_to_loopback,
    )
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_credentials=False,  # bearer keys, never cookies: no credentialed wildcard
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(RequestObserver, metrics=state.metrics, subscribers=state.subscribers)


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version="1", summary=app.summary, routes=app.routes)
    _, definitions = models_json_schema(
        [(model, "validation") for model in (*REQUEST_MODELS, *NEW_DIALECT_MODELS)],
        ref_template="#/components/schemas/{model}",
    )
    schema.setdefault("components", {}).setdefault("schemas", {}).update(
        definitions.get("$defs", {})
    )
    schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    schema["security"] = [{"bearer": []}]
    app.openapi_schema = schema
    return schema
