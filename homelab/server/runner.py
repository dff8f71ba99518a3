"""Running the app in uvicorn: in the foreground (``homelab serve``) or in a background thread
(the TUI, tests), with a handle to find it, stop it and follow its request log.
"""

from __future__ import annotations

import gc
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import uvicorn
from fastapi import FastAPI

from homelab.engine.prompt_cache.store import PromptCache
from homelab.errors import EngineError
from homelab.server.app import EngineProvider, RequestSubscriber, create_app, server_state
from homelab.server.config import ServerConfig
from homelab.server.engine_seam import EngineLike
from homelab.server.fleet import Fleet
from homelab.server.yielding import YieldController

STARTUP_TIMEOUT_S = 15.0
# how long a thread running Python keeps the GIL while another waits (CPython's default: 5 ms):
# the event loop takes it back sooner from threads preparing long requests (issue 39's soak)
SWITCH_INTERVAL_S = 0.001
# the collector's thresholds (CPython's: 700, 10, 10): a full collection over a long request's
# objects held the GIL ~45 ms each time; ten times rarer, it stalls the loop under ~16 ms
GC_THRESHOLDS = (2000, 20, 100)


class EngineHolder:
    """An engine provider for a model that is loaded after the server starts listening."""

    def __init__(self, engine: EngineLike | None = None) -> None:
        self.engine = engine
        self.failure: BaseException | None = None

    def __call__(self) -> EngineLike | None:
        return self.engine


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before uvicorn starts, so port 0 gives a known free port and errors come early."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise EngineError(
            f"cannot listen on {host}:{port} ({exc.strerror}).", hint="Choose another --port."
        ) from exc
    sock.listen(2048)  # clients that come early wait in the backlog until uvicorn accepts
    sock.set_inheritable(True)
    return sock


# An idle keep-alive connection is kept this long. Clients' pools drop theirs after their own
# expiry (httpx and so the openai SDK: 5 s, aiohttp 15 s); a server that closes first, at the
# moment a client reuses the connection, makes that request fail with a read error (seen
# with uvicorn's default of 5 s against httpx's 5 s). Longer than the clients', as proxies do.
KEEP_ALIVE_S = 65


def uvicorn_server(app: FastAPI) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        log_config=None,  # our logging setup; uvicorn's access log would print query strings
        access_log=False,
        lifespan="on" if server_state(app).yielding is not None else "off",  # its watcher
        timeout_graceful_shutdown=3,
        timeout_keep_alive=KEEP_ALIVE_S,
        server_header=False,
    )
    return uvicorn.Server(config)


class ServerHandle:
    """A server running in a background thread."""

    def __init__(
        self, app: FastAPI, server: uvicorn.Server, thread: threading.Thread, url: str
    ) -> None:
        self.app = app
        self.url = url  # e.g. http://127.0.0.1:8080 (the OpenAI base URL is url + "/v1")
        self._server = server
        self._thread = thread

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def subscribe(self, callback: RequestSubscriber) -> Callable[[], None]:
        """Call ``callback(RequestRecord)`` after each request (from the server's thread)."""
        return server_state(self.app).subscribe(callback)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def thread(self) -> threading.Thread:
        """The thread that runs the server's event loop."""
        return self._thread

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)


def start_server(
    engine: EngineLike | EngineProvider | None,
    host: str = "127.0.0.1",
    port: int = 0,
    config: ServerConfig | None = None,
    fleet: Fleet | None = None,
    prompt_cache: PromptCache | None = None,
    yielding: YieldController | None = None,
) -> ServerHandle:
    """Serve ``engine`` (or an engine provider), or every model of ``fleet`` (``engine``
    None), on ``host:port`` (0: a free port) in a thread; ``prompt_cache`` is the engines'
    (for the admin slot routes and ``/metrics``)."""
    config = replace(config or ServerConfig(), host=host)
    provider: EngineProvider = engine if callable(engine) else (lambda: engine)
    sock = bind_socket(host, port)
    bound_port = sock.getsockname()[1]
    config = replace(config, port=bound_port)
    app = create_app(provider, config, fleet, prompt_cache=prompt_cache, yielding=yielding)
    server = uvicorn_server(app)
    shown_host = f"[{host}]" if ":" in host else host
    url = f"http://{shown_host}:{bound_port}"
    thread = threading.Thread(
        target=run_holding_lock, args=(server, sock, url), name="homelab-server", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise EngineError(f"the server did not start on {host}:{bound_port}.")
        time.sleep(0.01)
    return ServerHandle(app, server, thread, url)


def run_holding_lock(server: uvicorn.Server, sock: socket.socket, url: str) -> None:
    """Serve until stopped, holding the server lock so `homelab bench` will not compete."""
    from homelab.lock import server_lock

    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.set_threshold(*GC_THRESHOLDS)
    with server_lock(url):
        server.run(sockets=[sock])
