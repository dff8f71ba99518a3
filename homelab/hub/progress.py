"""How long-running hub work (downloads, verification) reports progress.

The CLI shows a tqdm bar; the TUI's model picker passes its own sink that posts messages.
"""

from __future__ import annotations

from typing import Protocol


class ProgressSink(Protocol):
    def start(self, label: str, total_bytes: int, done_bytes: int) -> None:
        """A new phase begins (``done_bytes`` > 0 when a download resumes)."""

    def advance(self, n_bytes: int) -> None: ...

    def note(self, message: str) -> None:
        """A one-line remark (resuming, retrying, verified…)."""

    def finish(self) -> None: ...


class SilentProgress:
    """Reports nothing (library calls, tests)."""

    def start(self, label: str, total_bytes: int, done_bytes: int) -> None:
        pass

    def advance(self, n_bytes: int) -> None:
        pass

    def note(self, message: str) -> None:
        pass

    def finish(self) -> None:
        pass
