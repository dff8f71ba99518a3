"""Units, in one place: byte constants, byte sizes as people type them (``24GiB``, ``512MiB``,
``24GB``, ``1.5G``, ``1073741824``) and as homelab prints them."""

from __future__ import annotations

import re

from homelab.errors import PlanError

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 1000,
    "m": 1 << 20, "mib": 1 << 20, "mb": 1000**2,
    "g": 1 << 30, "gib": 1 << 30, "gb": 1000**3,
    "t": 1 << 40, "tib": 1 << 40, "tb": 1000**4,
}  # fmt: skip
_SIZE = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in ``text``; binary units for K/M/G/T and KiB/MiB/GiB/TiB, decimal for KB/MB/GB/TB."""
    match = _SIZE.match(text)
    unit = match["unit"].lower() if match else ""
    if match is None or unit not in _UNITS:
        raise PlanError(
            f"{text!r} is not a size.", hint="Write it like 24GiB, 512MiB, 24GB or a byte count."
        )
    return int(float(match["number"]) * _UNITS[unit])


NOT_AVAILABLE = "N/A"  # what a size that could not be read prints as


def format_size(n_bytes: float | None, digits: int = 2) -> str:
    """The largest unit that keeps the number >= 1: ``1.50 GiB``, ``512.00 MiB``, ``12.30 KiB``,
    ``17 B`` (``digits=1``: ``1.5 GiB``); None prints as ``N/A``."""
    if n_bytes is None:
        return NOT_AVAILABLE
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n_bytes) >= size:
            return f"{n_bytes / size:.{digits}f} {unit}"
    return f"{int(n_bytes)} B"


def format_gib(n_bytes: float | None, digits: int = 2) -> str:
    """Always in GiB (columns of memory figures line up): ``0.50 GiB``; None prints as ``N/A``."""
    return NOT_AVAILABLE if n_bytes is None else f"{n_bytes / GIB:.{digits}f} GiB"


def format_mib(n_bytes: float | None, digits: int = 1) -> str:
    """Always in MiB, with thousands separators: ``1,536.0 MiB``; None prints as ``N/A``."""
    return NOT_AVAILABLE if n_bytes is None else f"{n_bytes / MIB:,.{digits}f} MiB"
