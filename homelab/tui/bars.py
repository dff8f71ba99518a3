"""Stacked bars as text: how a whole (VRAM, RAM, KV cells) is shared out (Textual-free)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

FULL_BLOCK = "█"
LIGHT_SHADE = "░"


@dataclass(frozen=True)
class Segment:
    label: str
    amount: int
    style: str  # a Rich style, e.g. "green" or "bold #ff8800"
    character: str = FULL_BLOCK


def share_cells(amounts: list[int], width: int) -> list[int]:
    """Split ``width`` cells between ``amounts`` proportionally (largest remainder).

    A non-zero amount always gets at least one cell when there is room, so a small but
    present share (another process's 300 MiB) stays visible.
    """
    total = sum(max(amount, 0) for amount in amounts)
    if total <= 0 or width <= 0:
        return [0 for _ in amounts]
    exact = [max(amount, 0) * width / total for amount in amounts]
    cells = [int(value) for value in exact]
    by_remainder = sorted(range(len(amounts)), key=lambda i: exact[i] - cells[i], reverse=True)
    for index in by_remainder[: width - sum(cells)]:
        cells[index] += 1
    return _ensure_visible(cells, amounts)


def _ensure_visible(cells: list[int], amounts: list[int]) -> list[int]:
    for index, amount in enumerate(amounts):
        if amount > 0 and cells[index] == 0:
            donor = max(range(len(cells)), key=lambda i: cells[i])
            if cells[donor] > 1:
                cells[donor] -= 1
                cells[index] = 1
    return cells


def bar_text(segments: list[Segment], width: int) -> Text:
    cells = share_cells([segment.amount for segment in segments], width)
    text = Text(no_wrap=True, overflow="crop")
    for segment, count in zip(segments, cells, strict=True):
        text.append(segment.character * count, style=segment.style)
    return text
