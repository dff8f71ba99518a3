"""Pure ASGI layers around the routes, outermost first:

1. :class:`RequestObserver` counts every response by route and status, logs one line per
   request (never the prompt, never the query string) and publishes a :class:`RequestRecord`
   to subscribers (the TUI's request log).
2. :class:`TenantGate` authenticates the ``Authorization: Bearer`` (or ``x-api-key``) key, puts
   the tenant in the scope, keeps ``/metrics`` for admins (or loopback), and applies
   per-tenant concurrency and rate limits to the generation routes for as long as the
   response (stream) lasts.
3. :class:`BodyLimit` refuses bodies over the cap before they are parsed: at once from
   ``Content-Length``, or while reading a chunked body.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from homelab.server.auth import (
    LOCAL_TENANT,
    PREPARATION_LANE_KEY,
    Keys,
    RateLimited,
    Tenant,
    TenantLimiter,
    TenantLimits,
)
from homelab.server.errors import ApiError
from homelab.server.metrics import ServerMetrics

log = logging.getLogger("homelab.server")

TENANT_KEY = "homelab.tenant"
USAGE_KEY = "homelab.usage"  # dict the routes fill with token counts for the request log
PUBLIC_PATHS = frozenset({"/health"})
PAGE_PREFIX = "/web/"  # the web page's files (``web_page``): no secret in them, no key asked


def is_page_path(path: str) -> bool:
    """The web page (``/``) and its files: public, like ``/health``."""
    return path == "/" or path.startswith(PAGE_PREFIX)


ADMIN_PATHS = frozenset({"/metrics", "/admin/models", "/admin/models/load", "/admin/models/unload"})


def _is_admin_path(path: str) -> bool:
    """``/metrics`` and everything under ``/admin/`` (the slot routes take ids in the path)."""
    return path in ADMIN_PATHS or path.startswith("/admin/")


GENERATION_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"}
    | {"/v1/messages", "/v1/messages/count_tokens"}
    | {"/api/chat", "/api/generate", "/api/embed", "/api/embeddings"}  # Ollama's
)
KNOWN_ROUTES = frozenset(
    {*PUBLIC_PATHS, *ADMIN_PATHS, *GENERATION_PATHS, "/v1/models", "/openapi.json", "/props"}
    | {"/api/tags", "/api/show", "/api/ps", "/api/version", "/api/pull", "/api/v0/models"}
)
MAX_KEY_CHARS = 512
LOCAL = Tenant(LOCAL_TENANT, admin=True, limits=TenantLimits(max_concurrent_requests=0))  # one user


async def send_error(send: Send, error: ApiError, path: str = "") -> None:
    body = error.json_bytes(path)  # the envelope of the dialect the route at ``path`` speaks
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> list[bytes]:
    return [value for key, value in scope["headers"] if key.lower() == name]


class BodyLimit:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _too_large(self) -> ApiError:
        message = (
            f"The request body is larger than this server accepts ({self.max_body_bytes} bytes)."
        )
        return ApiError(413, message, code="request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared and (not declared[0].isdigit() or int(declared[0]) > self.max_body_bytes):
            await send_error(send, self._too_large(), scope["path"])
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise self._too_large()
            return message

        await self.app(scope, counting_receive, send)


class TenantGate:
    def __init__(
        self, app: ASGIApp, *, keys: Keys | None, limiter: TenantLimiter, bound_to_loopback: bool
    ) -> None:
        self.app = app
        self.keys = keys
        self.limiter = limiter
        self.bound_to_loopback = bound_to_loopback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS or is_page_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        if _is_admin_path(scope["path"]) and self._local_admin(scope):
            await self.app(scope, receive, send)
            return
        release: Callable[[], None] | None = None
        try:
            tenant = self._authenticate(scope)
            if _is_admin_path(scope["path"]) and not tenant.admin:
                raise ApiError(403, "This endpoint needs an admin key.", code="admin_only")
            if scope["path"] in GENERATION_PATHS and scope["method"] == "POST":
                release = self._admit(tenant)
        except ApiError as error:
            await send_error(send, error, scope["path"])
            return
        scope[TENANT_KEY] = tenant
        scope[PREPARATION_LANE_KEY] = self.limiter.preparation_lane(tenant)
        try:
            await self.app(scope, receive, send)
        finally:
            if release is not None:
                release()

    def _authenticate(self, scope: Scope) -> Tenant:
        if self.keys is None:
            return LOCAL
        tenant = self.keys.authenticate(_bearer_key(scope))
        if tenant is None:
            raise _unauthorized("Incorrect API key provided.")
        return tenant

    def _local_admin(self, scope: Scope) -> bool:
        """Admin routes are open to local clients of a server that only listens locally."""
        client_host = (scope.get("client") or ("", 0))[0]
        return self.bound_to_loopback and (client_host == "::1" or client_host.startswith("127."))

    def _admit(self, tenant: Tenant) -> Callable[[], None]:
        try:
            return self.limiter.acquire(tenant)
        except RateLimited as limited:
            headers = {"Retry-After": str(limited.retry_after_s)}
            raise ApiError(
                429, limited.reason, code="rate_limit_exceeded", headers=headers
            ) from None


def _bearer_key(scope: Scope) -> str:
    """The key of the one ``Authorization: Bearer`` header, or of the one ``x-api-key``
    header (Anthropic's clients), never from the URL. Both may come only with the same key."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if any(name in query for name in ("api_key", "key", "api-key", "token")):
        raise _unauthorized(
            "API keys are not accepted in the URL; send 'Authorization: Bearer <key>'."
        )
    values = _header(scope, b"authorization")
    api_keys = _header(scope, b"x-api-key")
    if not api_keys:
        return _authorization_key(values)
    if len(api_keys) != 1:
        raise _unauthorized("Send one 'x-api-key' header.")
    key = _checked_key(api_keys[0].decode("latin-1").strip())
    if values and _authorization_key(values) != key:
        raise _unauthorized("The 'x-api-key' and 'Authorization' headers carry different keys.")
    return key


def _authorization_key(values: list[bytes]) -> str:
    if len(values) != 1:
        raise _unauthorized("Send one 'Authorization: Bearer <key>' (or 'x-api-key') header.")
    scheme, _, key = values[0].decode("latin-1").strip().partition(" ")
    if scheme.lower() != "bearer":
        raise _unauthorized("Unsupported authorization scheme: use 'Authorization: Bearer <key>'.")
    return _checked_key(key.strip())


def _checked_key(key: str) -> str:
    if not key or len(key) > MAX_KEY_CHARS or any(c.isspace() for c in key):
        raise _unauthorized("Empty or malformed API key.")
    return key


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


@dataclass(frozen=True)
class RequestRecord:
    """One finished HTTP request, as the request log shows it (never prompt text)."""

    method: str
    route: str
    status: int
    tenant: str
    duration_s: float
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None

    @property
    def completion_tok_s(self) -> float:
        generating_s = self.duration_s - (self.ttft_s or 0.0)
        return self.completion_tokens / generating_s if generating_s > 0 else 0.0


class RequestObserver:
    def __init__(
        self,
        app: ASGIApp,
        metrics: ServerMetrics,
        subscribers: list[Callable[[RequestRecord], None]],
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.subscribers = subscribers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started_s = time.monotonic()
        status = 500
        scope[USAGE_KEY] = {}

        async def observing_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observing_send)
        finally:
            self._record(scope, status, time.monotonic() - started_s)

    def _record(self, scope: Scope, status: int, duration_s: float) -> None:
        route = scope["path"] if scope["path"] in KNOWN_ROUTES else "other"
        if is_page_path(scope["path"]):
            route = "/web"
        self.metrics.observe_response(route, status)
        tenant: Tenant | None = scope.get(TENANT_KEY)
        usage: dict[str, Any] = scope.get(USAGE_KEY, {})
        record = RequestRecord(
            scope["method"], route, status, tenant.name if tenant else "-", duration_s, **usage
        )
        if route not in ("/health", "/web"):
            log.info(
                "%s %s %d tenant=%s prompt=%d cached=%d completion=%d %.0fms",
                record.method, record.route, record.status, record.tenant, record.prompt_tokens,
                record.cached_tokens, record.completion_tokens, duration_s * 1000,
            )  # fmt: skip
        for subscriber in list(self.subscribers):
            try:
                subscriber(record)
            except Exception:  # a broken subscriber must not break serving
                log.exception("request-log subscriber failed")
