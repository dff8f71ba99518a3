"""A one-line stacked bar widget: how a whole (a GPU's VRAM, RAM, KV cells) is shared out."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from homelab.tui.bars import FULL_BLOCK, LIGHT_SHADE, Segment, bar_text

__all__ = ["FULL_BLOCK", "LIGHT_SHADE", "Segment", "StackedBar"]


class StackedBar(Widget):
    """Renders :class:`Segment` shares across its full width; ``update`` replaces them."""

    DEFAULT_CSS = """
    StackedBar { height: 1; width: 1fr; }
    """

    def __init__(self, segments: list[Segment] | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._segments = segments or []

    @property
    def segments(self) -> list[Segment]:
        return list(self._segments)

    def update(self, segments: list[Segment]) -> None:
        self._segments = segments
        self.refresh()

    def render(self) -> Text:
        if not self._segments:
            return Text(LIGHT_SHADE * self.size.width, style="dim")
        return bar_text(self._segments, self.size.width)
