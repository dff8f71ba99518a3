"""What the dashboard uses of the headless core, written down as Protocols (Textual-free).

The panels only ever touch these members, so the type checker proves that the real objects —
``homelab.engine.engine.Engine``, its ``RequestHandle``, ``homelab.server.runner.ServerHandle``
and :class:`homelab.tui.services.RunningServer` — provide them, and a test may hand in a fake.
The other core values the TUI shows (``Plan``, ``LoadReport``, ``EngineMetrics``,
``RequestRecord``) are plain frozen records and are used as they are.

The engine the dashboard loads is also the one it serves, so :class:`DashboardEngine` extends
the server's own :class:`~homelab.server.engine_seam.EngineLike`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from homelab.server.engine_seam import EngineLike, HandleLike

if TYPE_CHECKING:
    from homelab.engine.api import EngineMetrics, FinishEvent, GenerationRequest, TokenEvent
    from homelab.engine.loader import LoadReport
    from homelab.server.middleware import RequestRecord
    from homelab.settings import Settings


class AnswerStream(HandleLike, Protocol):
    """A submitted generation, read in a worker thread: token events, then one finish (or
    by the server, in asyncio: :class:`~homelab.server.engine_seam.HandleLike`)."""

    def __iter__(self) -> Iterator[TokenEvent | FinishEvent]: ...

    def chunks(self, interval_s: float = ...) -> Iterator[list[TokenEvent | FinishEvent]]:
        """The events in lists, taken every ``interval_s`` while tokens flow (the reader is
        not woken per token)."""
        ...


class DashboardEngine(EngineLike, Protocol):
    """A loaded model: what the server needs, plus what the panels show and control."""

    @property
    def settings(self) -> Settings: ...

    @property
    def load_report(self) -> LoadReport: ...

    def submit(self, request: GenerationRequest) -> AnswerStream: ...

    def subscribe(
        self, callback: Callable[[EngineMetrics], None], interval_s: float = ...
    ) -> Callable[[], None]:
        """Call ``callback`` from the engine's thread every ``interval_s``; returns unsubscribe."""
        ...

    def close(self) -> None: ...


class HttpServerHandle(Protocol):
    """A server running in a background thread (``homelab.server.runner.ServerHandle``)."""

    @property
    def base_url(self) -> str: ...

    def subscribe(self, callback: Callable[[RequestRecord], None]) -> Callable[[], None]: ...

    def stop(self, timeout_s: float = ...) -> None: ...


class ServerLike(Protocol):
    """The endpoint the server panel shows and stops (:class:`services.RunningServer`)."""

    @property
    def url(self) -> str: ...

    @property
    def keys_on(self) -> bool: ...

    def stop(self) -> None: ...
