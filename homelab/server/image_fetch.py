"""GET one image URL (``--allow-image-urls``) within a byte cap and one overall deadline.

A socket timeout alone bounds each read, not the fetch: a server that sends one byte every
few seconds (headers or body) never trips it and holds the thread for days. Here the
connection's socket is shut down when the deadline passes, whatever read is blocked on it,
so the fetch ends by the deadline; every way the peer can break HTTP
(``http.client.HTTPException``: a bad status line, a short body…) is a ``ValueError`` whose
text the validators turn into the dialect's 400. No redirects are followed.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Protocol

READ_CHUNK_BYTES = 64 * 1024


class FetchLimits(Protocol):
    """What a fetch may cost (an ``ImagePolicy``)."""

    @property
    def max_image_bytes(self) -> int: ...

    @property
    def url_timeout_s(self) -> float: ...


class _Watchdog:
    """Shuts down every socket the fetch opened once the deadline passes."""

    def __init__(self, timeout_s: float) -> None:
        self.deadline = time.monotonic() + timeout_s
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._expired = False
        self._timer = threading.Timer(timeout_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self._expired:
                _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self._expired = True
            for sock in self._sockets:
                _shut(sock)

    @property
    def expired(self) -> bool:
        return self._expired or time.monotonic() > self.deadline

    def stop(self) -> None:
        self._timer.cancel()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked recv at once (close would not)


def _watched(base: type[http.client.HTTPConnection], watchdog: _Watchdog) -> Any:
    class Watched(base):  # type: ignore[valid-type,misc]
        def connect(self) -> None:
            super().connect()
            watchdog.watch(self.sock)

    return Watched


class _HttpHandler(urllib.request.HTTPHandler):
    def __init__(self, watchdog: _Watchdog) -> None:
        super().__init__()
        self._connection = _watched(http.client.HTTPConnection, watchdog)

    def http_open(self, req: Any) -> Any:
        return self.do_open(self._connection, req)


class _HttpsHandler(urllib.request.HTTPSHandler):
    def __init__(self, watchdog: _Watchdog) -> None:
        super().__init__()
        self._connection = _watched(http.client.HTTPSConnection, watchdog)

    def https_open(self, req: Any) -> Any:
        return self.do_open(self._connection, req, context=self._context)  # type: ignore[attr-defined]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx then raises HTTPError: the client should give the final URL


def fetch_image(url: str, limits: FetchLimits) -> tuple[str | None, bytes]:
    """GET ``url`` (http(s), no redirects): (the declared MIME type, the bytes)."""
    watchdog = _Watchdog(limits.url_timeout_s)
    opener = urllib.request.build_opener(
        _NoRedirect, _HttpHandler(watchdog), _HttpsHandler(watchdog)
    )
    request = urllib.request.Request(url, headers={"Accept": "image/*"})
    try:
        with opener.open(request, timeout=limits.url_timeout_s) as response:
            mime = response.headers.get_content_type()
            body = _read_capped(response, limits, watchdog)
    except urllib.error.HTTPError as exc:
        raise ValueError(f"fetching the image URL failed: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        if watchdog.expired:
            raise _too_slow(limits) from None
        reason = getattr(exc, "reason", None) or type(exc).__name__
        raise ValueError(f"fetching the image URL failed ({reason})") from None
    finally:
        watchdog.stop()
    return (mime if mime.startswith("image/") else None), body


def _read_capped(response: Any, limits: FetchLimits, watchdog: _Watchdog) -> bytes:
    chunks: list[bytes] = []
    size_bytes = 0
    while chunk := response.read1(READ_CHUNK_BYTES):  # one recv: the deadline seen each time
        size_bytes += len(chunk)
        if size_bytes > limits.max_image_bytes:
            raise ValueError(
                f"the image at the URL is more than the {limits.max_image_bytes} bytes this "
                "server accepts"
            )
        if watchdog.expired:
            raise _too_slow(limits)
        chunks.append(chunk)
    if watchdog.expired:  # the watchdog cut the body short: not the whole image
        raise _too_slow(limits)
    missing_bytes = getattr(response, "length", None)
    if missing_bytes:  # read1 does not raise IncompleteRead: the peer closed early
        raise ValueError(
            f"fetching the image URL failed (the response ended {missing_bytes} bytes short)"
        )
    return b"".join(chunks)


def _too_slow(limits: FetchLimits) -> ValueError:
    return ValueError(
        f"fetching the image URL took more than {limits.url_timeout_s:g} s; "
        "send the image inline as a data URL"
    )
