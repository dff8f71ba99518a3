"""Small text helpers shared by the widgets (Textual-free)."""

from __future__ import annotations

NOT_AVAILABLE = "N/A"
HIDDEN = "–"  # shown instead of live numbers while they are frozen (snapshot mode)


def human_tokens(tokens: int) -> str:
    """4096 -> "4k", 10496 -> "10.2k", 131072 -> "128k", 1048576 -> "1M", 1000 -> "1000".

    Never rounds up: a context shown as "10.2k" is really reachable.
    """
    if tokens >= 1 << 20 and tokens % (1 << 20) == 0:
        return f"{tokens >> 20}M"
    if tokens >= 1024:
        whole, tenths = divmod(tokens * 10 // 1024, 10)
        return f"{whole}k" if tenths == 0 and tokens % 1024 == 0 else f"{whole}.{tenths}k"
    return str(tokens)


def rate(value_tok_s: float | None) -> str:
    if value_tok_s is None:
        return NOT_AVAILABLE
    return f"{value_tok_s:,.1f}" if value_tok_s < 100 else f"{value_tok_s:,.0f}"


def seconds(value_s: float | None) -> str:
    if value_s is None:
        return NOT_AVAILABLE
    return f"{value_s * 1000:.0f} ms" if value_s < 1 else f"{value_s:.2f} s"


def shown(value: object, unit: str = "") -> str:
    return NOT_AVAILABLE if value is None else f"{value}{unit}"


def percent(part: int, whole: int) -> str:
    return NOT_AVAILABLE if whole <= 0 else f"{100 * part / whole:.0f}%"
