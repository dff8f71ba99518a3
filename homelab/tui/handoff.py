"""Hand-offs from background threads to the UI loop (Textual-free).

The engine publishes metrics from its own thread and a generation streams tokens from a
worker thread; neither may touch widgets. They drop values here and the UI picks them up:

* :class:`Coalescer` keeps only the newest value and asks for one wake-up at a time, so a
  burst of updates becomes a single UI message.
* :class:`TextBuffer` accumulates streamed text until the UI's next steady-rate flush.
* :class:`Inbox` collects items (request-log entries) for the next flush.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Coalescer(Generic[T]):
    """Newest-value mailbox: ``put`` from any thread, ``take`` on the UI loop."""

    def __init__(self, wake: Callable[[], object]) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._value: T | None = None
        self._waiting = False

    def put(self, value: T) -> None:
        with self._lock:
            self._value = value
            if self._waiting:
                return
            self._waiting = True
        self._wake()

    def take(self) -> T | None:
        with self._lock:
            value, self._value = self._value, None
            self._waiting = False
            return value


class TextBuffer:
    """Text appended by a streaming thread, drained by the UI at a fixed rate."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: list[str] = []

    def append(self, text: str) -> None:
        if text:
            with self._lock:
                self._parts.append(text)

    def drain(self) -> str:
        with self._lock:
            parts, self._parts = self._parts, []
        return "".join(parts)


class Inbox(Generic[T]):
    """Items posted by a background thread, drained (all at once) by the UI."""

    def __init__(self, limit: int = 1000) -> None:
        self._lock = threading.Lock()
        self._items: list[T] = []
        self._limit = limit

    def add(self, item: T) -> None:
        with self._lock:
            self._items.append(item)
            del self._items[: -self._limit]

    def drain(self) -> list[T]:
        with self._lock:
            items, self._items = self._items, []
        return items


class PullProgress:
    """A hub ``ProgressSink`` (homelab.hub.progress) that hands (label, done, total) to the UI
    through a :class:`Coalescer`: a download's thousands of chunks become a few UI updates."""

    def __init__(self, box: Coalescer[tuple[str, int, int]]) -> None:
        self._box = box
        self._label = ""
        self._done_bytes = 0
        self._total_bytes = 0
        self.notes: list[str] = []

    def start(self, label: str, total_bytes: int, done_bytes: int) -> None:
        self._label, self._total_bytes, self._done_bytes = label, total_bytes, done_bytes
        self._publish()

    def advance(self, n_bytes: int) -> None:
        self._done_bytes += n_bytes
        self._publish()

    def note(self, message: str) -> None:
        self.notes.append(message)

    def finish(self) -> None:
        self._done_bytes = self._total_bytes
        self._publish()

    def _publish(self) -> None:
        self._box.put((self._label, self._done_bytes, self._total_bytes))
