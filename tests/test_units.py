"""Sizes as people type them and as homelab prints them (homelab.units)."""

from __future__ import annotations

import pytest

from homelab.errors import PlanError
from homelab.units import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [("24GiB", 24 << 30), ("512MiB", 512 << 20), ("24GB", 24 * 10**9), ("1.5G", 3 << 29),
     ("1073741824", 1 << 30), (" 8 gib ", 8 << 30)],
)  # fmt: skip
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "12 parsecs", "-1GiB"])
def test_parse_size_rejects_nonsense(text: str) -> None:
    with pytest.raises(PlanError):
        parse_size(text)


def test_format_size() -> None:
    assert format_size(3 << 29) == "1.50 GiB"
    assert format_size(512 << 20) == "512.00 MiB"
    assert format_size(100) == "100 B"
