"""The web page at ``/``: chat and the dashboard, from the static files in ``web/``.

The page is plain ES modules (``web/*.js``), one stylesheet and two vendored libraries
(``web/vendor/``: marked renders markdown, DOMPurify sanitizes what it renders; ``make
web-vendor`` fetches them again from npm). It holds no secret, so it is served without a key
(``middleware.is_page_path``); everything it shows comes from the API routes, which ask for
one. Every file goes out with a strict Content-Security-Policy: scripts only from this
server (no inline script, no eval), connections only to it, images from it or from
``data:`` / ``blob:`` URLs (attached images), nothing framed, no plugins.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import Response

from homelab.server.errors import ApiError
from homelab.server.middleware import PAGE_PREFIX

WEB_DIR = Path(__file__).parent / "web"
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",  # revalidated: an upgraded server serves its own page
}
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
}


def add_routes(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def page() -> Response:
        return page_file("index.html")

    @app.get(PAGE_PREFIX + "{name:path}", include_in_schema=False)
    async def asset(name: str) -> Response:
        return page_file(name)


def page_file(name: str) -> Response:
    """A file of the page, with its headers; a 404 for anything outside ``web/``."""
    root = WEB_DIR.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root) or not path.is_file() or path.suffix not in MEDIA_TYPES:
        raise ApiError(404, f"The web page has no file '{name}'.", code="unknown_route")
    return Response(path.read_bytes(), media_type=MEDIA_TYPES[path.suffix], headers=PAGE_HEADERS)
