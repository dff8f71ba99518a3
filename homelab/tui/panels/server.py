"""The server panel's controller: serve the loaded model over HTTP, stop it, show its log.

Starting a server needs a model: without one it loads first (a model whose GPU is given back
is served as ``homelab serve`` serves it while yielded: requests wait for the resume, then get
a 503). The request log arrives from the server's thread through an :class:`Inbox` (status,
tenant, tokens — never prompt text).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from homelab.errors import HomelabError
from homelab.tui import services
from homelab.tui.handoff import Inbox
from homelab.tui.messages import RequestsLogged, ServerStarted, ServerStopped, TaskFailed
from homelab.tui.panels import in_thread

if TYPE_CHECKING:
    from textual.app import App

    from homelab.server.middleware import RequestRecord
    from homelab.tui.panels.live import LiveController
    from homelab.tui.protocols import ServerLike
    from homelab.tui.screens.dashboard import Dashboard
    from homelab.tui.widgets.server import ServerPanel


class ServerController:
    dashboard: Dashboard  # attached once mounted (to bring the panel into view when paged)
    panel: ServerPanel

    def __init__(
        self, app: App[None], live: LiveController, *, host: str, port: int, frozen: bool
    ) -> None:
        self.app = app
        self.live = live
        self.host = host
        self.port = port
        self.frozen = frozen
        self.server: ServerLike | None = None
        self.request_log: Inbox[RequestRecord] = Inbox()

    def attach(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard
        self.panel = dashboard.server_panel

    def toggle(self) -> None:
        server = self.forget()
        if server is not None:
            in_thread(self.app, lambda: self._stop(server), name="stop_server", group="server")
            return
        self.dashboard.show_panel("server")
        engine = self.live.engine
        if engine is None and not self.live.yielded:
            self.panel.show_starting("loading the model first…")
            self.live.after_load(self.toggle)
            return
        self.panel.show_starting("starting…")
        name = self.live.served_name
        in_thread(self.app, lambda: self._start(name), name="start_server", group="server")

    def forget(self) -> ServerLike | None:
        """Hand over the running server (to stop it) and forget it."""
        server, self.server = self.server, None
        return server

    def _start(self, name: str) -> None:
        live = self.live
        try:
            server = services.start_server(
                live.holder,
                name,
                self.host,
                self.port,
                on_request=self._request_logged,
                yielding=live.yielding,
            )
        except HomelabError as error:
            self.app.post_message(TaskFailed("starting the server", error, modal=True))
            self.app.post_message(ServerStopped())
        else:
            self.app.post_message(ServerStarted(server))

    def _request_logged(self, entry: RequestRecord) -> None:
        self.request_log.add(entry)
        self.app.post_message(RequestsLogged())

    def started(self, message: ServerStarted) -> None:
        self.server = message.server
        self.panel.show_running(message.server.url, message.server.keys_on)
        self.show_models()
        self.app.notify(message.server.url, title="Server running")

    def _stop(self, server: ServerLike) -> None:
        server.stop()
        self.app.post_message(ServerStopped())

    def show_models(self) -> None:
        """List what the server has loaded: the TUI serves its one engine."""
        engine = self.live.engine
        if self.server is not None and engine is not None:
            self.panel.show_models(services.served_models(engine, self.live.plans.plan))
        elif self.server is not None and self.live.yielded:
            self.panel.show_yielded(self.live.served_name, self.live.yield_hint())

    def show_stopped(self) -> None:
        self.panel.show_stopped()

    def show_log(self) -> None:
        entries = self.request_log.drain()
        if entries:
            self.panel.log_requests(entries, frozen=self.frozen)
