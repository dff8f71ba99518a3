"""The FastAPI application: routes, error handlers, the middleware stack, the OpenAPI document.

``create_app(engine_provider, config)`` serves one model. ``engine_provider()`` returns the
engine, or None while it is still loading (then ``/health`` and generation answer 503).
Request bodies are parsed by hand from raw bytes (see :mod:`homelab.server.protocol`), so
every malformed body gets the OpenAI error envelope with a 400, never FastAPI's 422.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import anyio.to_thread
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from homelab.engine.prompt_cache.store import PromptCache
from homelab.errors import HomelabError
from homelab.server import (
    anthropic,
    chat,
    completions,
    dashboard,
    embeddings,
    model_cards,
    ollama,
    responses,
    slots_admin,
    web_page,
    yield_admin,
)
from homelab.server.anthropic_protocol import (
    BLOCK_TYPES,
    AnthropicErrorResponse,
    CountTokensRequest,
    MessageResponse,
    MessagesRequest,
    MessageTokensCount,
)
from homelab.server.auth import KeyFile, Tenant, TenantLimiter
from homelab.server.body_shape import SCAN_FROM_BYTES, check_body_shape
from homelab.server.config import ServerConfig
from homelab.server.engine_seam import EngineLike
from homelab.server.errors import (
    ApiError,
    api_error_from,
    api_error_from_validation,
    invalid_request,
    json_body_name,
    service_unavailable,
)
from homelab.server.file_facts import file_details
from homelab.server.fleet import LEASES_KEY, Fleet, LeaseRelease, parse_keep_alive
from homelab.server.image_parts import image_context
from homelab.server.metrics import CONTENT_TYPE, ServerMetrics, render_fleet
from homelab.server.middleware import (
    TENANT_KEY,
    USAGE_KEY,
    BodyLimit,
    RequestObserver,
    RequestRecord,
    TenantGate,
)
from homelab.server.model_cards import model_details
from homelab.server.ollama_protocol import OLLAMA_REQUEST_MODELS
from homelab.server.protocol import (
    REQUEST_MODELS,
    ChatCompletionRequest,
    CompletionRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    body_doc,
    small_body_doc,
)
from homelab.server.protocol import ChatCompletion as ChatCompletionResponse
from homelab.server.protocol import Completion as CompletionResponse
from homelab.server.response_store import ResponseStore
from homelab.server.responses_protocol import ResponsesRequest
from homelab.server.serving import RequestContext, preparation_lane
from homelab.server.yielding import YieldController

NEW_DIALECT_MODELS: tuple[type[BaseModel], ...] = (
    ResponsesRequest,
    embeddings.EmbeddingRequest,
    *OLLAMA_REQUEST_MODELS,
)
ANTHROPIC_MODELS: tuple[type[BaseModel], ...] = (
    MessagesRequest,
    CountTokensRequest,
    *BLOCK_TYPES.values(),  # content blocks, named by MessageParam's content
)
ANTHROPIC_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": AnthropicErrorResponse} for status in (400, 401, 403, 404, 413, 429, 500, 503)
}

log = logging.getLogger("homelab.server")

# bodies that carry no image and no tools: validated on the loop (no thread hop)
TEXT_ONLY_MODELS: frozenset[type[BaseModel]] = frozenset(
    {CompletionRequest, embeddings.EmbeddingRequest}
)
EngineProvider = Callable[[], EngineLike | None]
RequestSubscriber = Callable[[RequestRecord], None]
Body = TypeVar("Body", bound=BaseModel)
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 403, 404, 413, 429, 500, 503)
}


class ServerState:
    """Per-app state the routes share (stored on ``app.state.homelab``)."""

    def __init__(
        self, engine_provider: EngineProvider, config: ServerConfig, fleet: Fleet | None = None
    ) -> None:
        self.engine_provider = engine_provider
        self.config = config
        self.fleet = fleet  # several models (homelab serve without MODEL); None: one model
        self.prompt_cache: PromptCache | None = None  # saved slot states (slots_admin)
        self.yielding: YieldController | None = None  # the GPU given back and taken again
        self.metrics = ServerMetrics()
        self.limiter = TenantLimiter()
        self.subscribers: list[RequestSubscriber] = []
        self.request_log = dashboard.RequestLog()  # the web page's dashboard
        self.subscribers.append(self.request_log.observe)
        self.started = int(time.time())
        self.responses = ResponseStore(
            config.stored_responses,
            config.stored_response_bytes,
            config.stored_response_ttl_s,
            config.stored_response_tenant_share,
        )

    def engine(self) -> EngineLike:
        if self.fleet is not None:
            raise invalid_request("Name the model: this server serves several.", param="model")
        engine = self.engine_provider()
        if engine is None:
            raise service_unavailable(
                "The model is still loading. Retry shortly.", code="model_loading", retry_after_s=5
            )
        failure = engine_failure(engine)
        if failure is not None:  # for good (a lost RPC worker): no Retry-After
            raise ApiError(503, failure, code="engine_failed")
        return engine

    def loaded_engines(self) -> list[EngineLike]:
        """The engines loaded now (none while the one model loads)."""
        if self.fleet is not None:
            return [m.engine for m in self.fleet.residents() if m.engine is not None]
        engine = self.engine_provider()
        return [] if engine is None else [engine]

    def identity_of(self, tenant: str) -> str:
        """The identity of the tenant named ``tenant`` now (an identity stays itself)."""
        known = self.config.keys.tenants.get(tenant) if self.config.keys is not None else None
        return tenant if known is None else known.identity

    def forget_tenants(self, tenants: list[Tenant]) -> None:
        """The last keys of ``tenants`` were removed: their stored responses go now, their
        slots and prompt states in a thread (the slots wait for the lane)."""
        identities = [tenant.identity for tenant in tenants]
        for identity in identities:
            self.responses.drop_tenant(identity)
        cache, engines = self.prompt_cache, self.loaded_engines()

        def forget() -> None:
            for identity in identities:
                removed = slots_admin.forget_states(cache, engines, identity, None)
                log.info("tenant %s: its %d saved prompt states deleted", identity, removed)

        threading.Thread(target=forget, name="homelab-forget-tenants", daemon=True).start()

    def subscribe(self, callback: RequestSubscriber) -> Callable[[], None]:
        self.subscribers.append(callback)
        return lambda: self.subscribers.remove(callback) if callback in self.subscribers else None


def engine_failure(engine: EngineLike | None) -> str | None:
    """Why ``engine`` can serve nothing more (``Engine.failure``: a lost RPC worker), or None."""
    return None if engine is None else engine.failure


def create_app(
    engine_provider: EngineProvider,
    config: ServerConfig,
    fleet: Fleet | None = None,
    *,
    prompt_cache: PromptCache | None = None,
    yielding: YieldController | None = None,
) -> FastAPI:
    """One model from ``engine_provider``, or, with ``fleet``, every model of the fleet
    (``engine_provider`` is then unused). ``prompt_cache``: the engines' saved states, for
    the admin routes and ``/metrics`` (``slots_admin``). ``yielding``: yield and resume
    (``server.yielding``; its watcher runs with the server's lifespan)."""
    app = FastAPI(
        title="homelab",
        summary="OpenAI-compatible endpoint for local models",
        docs_url=None,
        redoc_url=None,
        lifespan=yield_admin.lifespan(yielding) if yielding is not None else None,
    )
    state = ServerState(engine_provider, config, fleet)
    state.yielding = yielding
    app.state.homelab = state
    if yielding is not None:
        yield_admin.add_routes(app, yielding)
    _add_routes(app, state)
    state.prompt_cache = prompt_cache
    slots_admin.add_routes(
        app,
        prompt_cache,
        lambda model: _admin_engine(state, model),
        state.loaded_engines,
        state.identity_of,
    )
    if isinstance(config.keys, KeyFile):  # a key removed: what the server keeps for it goes
        config.keys.on_removed.append(state.forget_tenants)
    ollama.add_routes(app, state, parse_body, lambda r, model: serving_context(state, r, model))
    model_cards.add_routes(app, state)  # /props, LM Studio's /api/v0/models
    if fleet is not None:
        _add_fleet_routes(app, state, fleet)
    _add_page_routes(app, state)
    _add_error_handlers(app)
    _add_middleware(app, state)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def server_state(app: FastAPI) -> ServerState:
    return app.state.homelab  # type: ignore[no-any-return]


async def parse_body(request: Request, model: type[Body]) -> Body:
    """The request body as ``model``; any problem is a 400 in the route's dialect."""
    try:
        raw = await request.body()
    except ClientDisconnect:  # gone mid-upload: nobody reads the answer, nothing to log
        raise ApiError(
            400, "The client disconnected during the upload.", code="client_disconnected"
        ) from None
    context = image_context(server_state(request.app).config.image_policy)
    try:
        if model in TEXT_ONLY_MODELS and len(raw) < SCAN_FROM_BYTES:
            return _validated(model, raw, context)
        # whatever its spelling (a JSON escape hides the bytes "image"), a body of a route that
        # takes images may decode (or fetch) them: validated off the event loop, always
        lane = preparation_lane(request.scope)  # one at a time per tenant
        return await anyio.to_thread.run_sync(_validated, model, raw, context, limiter=lane)
    except ValidationError as exc:
        raise api_error_from_validation(exc) from None


def _validated(model: type[Body], raw: bytes, context: dict[str, Any]) -> Body:
    check_body_shape(raw)  # before the parse, which holds the GIL however long it takes
    return model.model_validate_json(raw, context=context)


async def serving_context(state: ServerState, request: Request, model: str) -> RequestContext:
    """What a generation route serves a request with: the engine, config and counters.

    One model: that engine (a 503 while it loads). Several (``serve`` without MODEL): the
    request's model, loaded first when needed and held (a lease, returned by
    :class:`~homelab.server.fleet.LeaseRelease` when the response has ended)."""
    tenant, usage = request.scope[TENANT_KEY], request.scope.setdefault(USAGE_KEY, {})
    if state.yielding is not None:  # yielded: wait for the GPU to come back, or 503
        await state.yielding.admit(request.scope)
    if state.fleet is None:
        return RequestContext(state.engine(), state.config, state.metrics, tenant, usage, request)
    model = state.config.resolve_alias(model)  # claude-* -> a fleet model
    lease = await state.fleet.acquire(model, await _keep_alive(request))
    request.scope.setdefault(LEASES_KEY, []).append(lease)
    config = replace(state.config, model_id=lease.model.name, model_aliases=())
    return RequestContext(lease.engine, config, lease.model.metrics, tenant, usage, request)


async def _keep_alive(request: Request) -> float | bool | None:
    """The request's own ``keep_alive`` (Ollama's), or False: the fleet's default."""
    raw = await request.body()  # cached by Starlette: parsed already
    if b'"keep_alive"' not in raw:
        return False
    value = json.loads(raw).get("keep_alive")
    if value is None:
        return False
    try:
        return parse_keep_alive(value)
    except HomelabError as exc:
        raise invalid_request(exc.message, param="keep_alive") from None


def _add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health", responses={503: {"description": "the model is loading, or failed"}})
    async def health() -> JSONResponse:
        if state.yielding is not None and state.yielding.state != "serving":
            return JSONResponse(
                _yield_fields(state.yielding) | {"status": state.yielding.shown_state()}
            )
        if state.fleet is not None:  # several models: serving as soon as it listens
            loaded_models = [s.name for s in state.fleet.residents()]
            return JSONResponse({"status": "ok", "loaded": loaded_models})
        engine = state.engine_provider()
        failure = engine_failure(engine)
        if failure is not None:
            return JSONResponse({"status": "failed", "reason": failure}, status_code=503)
        loaded = engine is not None
        return JSONResponse(
            {"status": "ok" if loaded else "loading"}, status_code=200 if loaded else 503
        )

    @app.get("/metrics", response_class=PlainTextResponse, responses=ERROR_RESPONSES)
    async def metrics() -> Response:
        cache_lines = slots_admin.metrics_lines(state.prompt_cache)
        if state.yielding is not None:
            cache_lines += state.yielding.metrics_lines()
        if state.fleet is not None:
            body = render_fleet(state.metrics, state.fleet) + cache_lines
            return Response(body, media_type=CONTENT_TYPE)
        engine = state.engine_provider()
        snapshot = engine.metrics() if engine is not None else None
        body = state.metrics.render(snapshot, state.config.model_id) + cache_lines
        return Response(body, media_type=CONTENT_TYPE)

    @app.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
    async def list_models() -> Any:
        if state.fleet is not None:  # with each model's status (past the ModelList schema)
            fleet = state.fleet
            cards = [_fleet_card(state, fleet, n) for n in fleet.names()]
            return JSONResponse({"object": "list", "data": cards})
        card = _model_card(state)
        if state.yielding is not None and state.yielding.state != "serving":
            card |= _yield_fields(state.yielding)
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/v1/models/{model}", response_model=ModelCard, responses=ERROR_RESPONSES)
    async def retrieve_model(model: str) -> JSONResponse:
        if state.fleet is not None:
            state.fleet.model(model)  # the 404 for unknown names
            return JSONResponse(_fleet_card(state, state.fleet, model))
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
        openapi_extra=body_doc("ChatCompletionRequest"),
    )
    async def chat_completions(request: Request) -> Response:
        body = await parse_body(request, ChatCompletionRequest)
        ctx = await serving_context(state, request, body.model)
        return await chat.chat_completion(ctx, body)

    @app.post(
        "/v1/completions",
        response_model=CompletionResponse,
        responses=ERROR_RESPONSES,
        openapi_extra=body_doc("CompletionRequest"),
    )
    async def text_completions(request: Request) -> Response:
        body = await parse_body(request, CompletionRequest)
        ctx = await serving_context(state, request, body.model)
        return await completions.text_completion(ctx, body)

    @app.post(
        "/v1/responses", responses=ERROR_RESPONSES, openapi_extra=body_doc("ResponsesRequest")
    )
    async def create_response(request: Request) -> Response:
        body = await parse_body(request, ResponsesRequest)
        ctx = await serving_context(state, request, body.model)
        return await responses.create_response(ctx, body, state.responses)

    @app.get("/v1/responses/{response_id}", responses=ERROR_RESPONSES)
    async def retrieve_response(request: Request, response_id: str) -> JSONResponse:
        stored = state.responses.get(request.scope[TENANT_KEY].name, response_id)
        return JSONResponse(stored.response)

    @app.delete("/v1/responses/{response_id}", responses=ERROR_RESPONSES)
    async def delete_response(request: Request, response_id: str) -> JSONResponse:
        state.responses.delete(request.scope[TENANT_KEY].name, response_id)
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})

    @app.post(
        "/v1/embeddings", responses=ERROR_RESPONSES, openapi_extra=body_doc("EmbeddingRequest")
    )
    async def create_embeddings(request: Request) -> Response:
        body = await parse_body(request, embeddings.EmbeddingRequest)
        ctx = await serving_context(state, request, body.model)
        return await embeddings.create_embeddings(ctx, body)

    @app.post(
        "/v1/messages",
        response_model=MessageResponse,
        responses=ANTHROPIC_ERRORS,
        openapi_extra=body_doc("MessagesRequest"),
    )
    async def create_message(request: Request) -> Response:
        body = await parse_body(request, MessagesRequest)
        ctx = await serving_context(state, request, body.model)
        return await anthropic.create_message(ctx, body)

    @app.post(
        "/v1/messages/count_tokens",
        response_model=MessageTokensCount,
        responses=ANTHROPIC_ERRORS,
        openapi_extra=body_doc("CountTokensRequest"),
    )
    async def count_message_tokens(request: Request) -> Response:
        body = await parse_body(request, CountTokensRequest)
        ctx = await serving_context(state, request, body.model)
        return await anthropic.count_tokens(ctx, body)


def _fleet_card(state: ServerState, fleet: Fleet, name: str) -> dict[str, Any]:
    model = fleet.models[name]
    card = {
        "id": name,
        "object": "model",
        "created": state.started,
        "owned_by": "homelab",
        "status": model.status,
    }
    if model.status == "unloaded" and _yielded(state, name):
        card |= _yield_fields(state.yielding)
    if model.engine is None:  # what its file says (the context is its plan's, when loaded)
        return card | file_details(model.servable.path)
    return card | model_details(model.engine)


def _yielded(state: ServerState, name: str) -> bool:
    """Whether ``name`` is unloaded because the server has given its GPU back."""
    yielding = state.yielding
    event = yielding.current if yielding is not None else None
    return (
        yielding is not None
        and yielding.state != "serving"
        and event is not None
        and (name in event.models)
    )


def _yield_fields(yielding: YieldController | None) -> dict[str, Any]:
    """``status: yielded`` and why, for /health, /v1/models and ``/admin/models``."""
    if yielding is None:
        return {}
    report = yielding.status()
    keys = ("state", "serving_from_cpu", "cause", "reason", "resumes")
    return {
        "status": "yielded (serving from CPU)" if yielding.on_cpu else "yielded",
        "yield": {k: report[k] for k in keys},
    }


def _add_fleet_routes(app: FastAPI, state: ServerState, fleet: Fleet) -> None:
    """What is loaded, and loading / unloading by hand (admin keys, or loopback clients)."""

    @app.get("/admin/models", responses=ERROR_RESPONSES)
    async def loaded_models() -> dict[str, Any]:
        rows = fleet.snapshot()
        for row in rows:
            if row["status"] == "unloaded" and _yielded(state, row["model"]):
                row |= _yield_fields(state.yielding)
        return {"object": "list", "data": rows}

    @app.post(
        "/admin/models/load",
        responses=ERROR_RESPONSES,
        openapi_extra=small_body_doc(("model",), model="string"),
    )
    async def load_model(request: Request) -> dict[str, Any]:
        name = _admin_model_name(await request.body())
        if state.yielding is not None and state.yielding.state != "serving":
            raise ApiError(409, "The server has given its GPU back: resume first.", code="yielded")
        slot = await fleet.load(name)
        return {"model": slot.name, "status": slot.status}

    @app.post(
        "/admin/models/unload",
        responses=ERROR_RESPONSES,
        openapi_extra=small_body_doc(("model",), model="string"),
    )
    async def unload_model(request: Request) -> dict[str, Any]:
        name = _admin_model_name(await request.body())
        unloaded = await fleet.unload(name)
        return {"model": name, "status": "unloaded", "unloaded": unloaded}


def _add_page_routes(app: FastAPI, state: ServerState) -> None:
    """The web page at ``/`` and the one admin route its dashboard polls."""

    def models() -> list[dict[str, Any]]:
        if state.fleet is not None:
            return dashboard.fleet_models(state.fleet)
        return dashboard.single_model(state.config.model_id, state.engine_provider())

    labels = dashboard.fleet_gpu_labels(state.fleet) if state.fleet is not None else {}
    web_page.add_routes(app)
    dashboard.add_routes(app, models, state.request_log, lambda: state.prompt_cache, labels)


async def _admin_engine(state: ServerState, model: str | None) -> Any:
    """The engine an admin slot route acts on: the only one, or the loaded ``model``."""
    if state.fleet is None:
        return state.engine()
    if not model:
        raise invalid_request("Name the model: ?model=NAME.", param="model")
    engine = state.fleet.model(model).engine
    if engine is None:
        raise invalid_request(f"The model '{model}' is not loaded.", param="model")
    return engine


def _admin_model_name(raw: bytes) -> str:
    return json_body_name(raw, "model", "which model")


def _model_card(state: ServerState) -> dict[str, Any]:
    card = {
        "id": state.config.model_id,
        "object": "model",
        "created": state.started,
        "owned_by": "homelab",
    }
    engine = state.engine_provider()
    return card | (model_details(engine) if engine is not None else {})


def _error_response(error: ApiError, path: str = "") -> JSONResponse:
    envelope = error.envelope_for(path)  # Anthropic's on /v1/messages, Ollama's on /api/
    return JSONResponse(envelope, status_code=error.status, headers=error.headers)


def _add_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        return _error_response(api_error_from(exc), request.url.path)

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        status = exc.status_code if isinstance(exc, StarletteHTTPException) else 500
        path = request.url.path
        if status == 404:
            return _error_response(ApiError(404, "Unknown route.", code="unknown_route"), path)
        if status == 405:
            return _error_response(
                ApiError(405, "Method not allowed for this route.", code="method_not_allowed"),
                path,
            )
        return _error_response(
            ApiError(status, "The request could not be handled.")
            if status < 500
            else api_error_from(exc),
            path,
        )

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        error = ApiError(400, "Invalid request parameters.", code="invalid_request")
        return _error_response(error, request.url.path)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_api_error)  # 500 with a generic message


def _add_middleware(app: FastAPI, state: ServerState) -> None:
    config = state.config
    # add_middleware wraps: the last one added is the outermost
    if state.fleet is not None or state.yielding is not None:
        app.add_middleware(LeaseRelease)  # innermost: after the response (stream) has ended
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
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version"],
        )
    app.add_middleware(RequestObserver, metrics=state.metrics, subscribers=state.subscribers)


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version="1", summary=app.summary, routes=app.routes)
    _, definitions = models_json_schema(
        [
            (model, "validation")
            for model in (*REQUEST_MODELS, *NEW_DIALECT_MODELS, *ANTHROPIC_MODELS)
        ],
        ref_template="#/components/schemas/{model}",
    )
    schema.setdefault("components", {}).setdefault("schemas", {}).update(
        definitions.get("$defs", {})
    )
    schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    schema["security"] = [{"bearer": []}]
    app.openapi_schema = schema
    return schema
