"""Text rendering shared by the hub's CLI verbs (the TUI renders the same objects itself)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from homelab.hub.progress import ProgressSink


def human_bytes(n_bytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n_bytes >= 1 << shift:
            return f"{n_bytes / (1 << shift):.2f} {unit}"
    return f"{n_bytes} B"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain left-aligned table (numbers right-aligned when the header starts with '>')."""
    right = [h.startswith(">") for h in headers]
    names = [h.lstrip(">") for h in headers]
    widths = [max(len(str(c)) for c in column) for column in zip(names, *rows, strict=False)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(c).rjust(w) if r else str(c).ljust(w)
            for c, w, r in zip(cells, widths, right, strict=False)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(names), *(line(row) for row in rows)])


class TqdmProgress(ProgressSink):
    """A tqdm bar on stderr per phase (download, verification)."""

    def __init__(self) -> None:
        self._bar: Any = None

    def start(self, label: str, total_bytes: int, done_bytes: int) -> None:
        from tqdm import tqdm

        self.finish()
        self._bar = tqdm(
            total=total_bytes,
            initial=done_bytes,
            desc=label[-40:],
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            file=sys.stderr,
            leave=False,
            dynamic_ncols=True,
        )

    def advance(self, n_bytes: int) -> None:
        if self._bar is not None:
            self._bar.update(n_bytes)

    def note(self, message: str) -> None:
        from tqdm import tqdm

        tqdm.write(f"homelab: {message}", file=sys.stderr)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
