"""The plan knobs a user can turn in the dashboard (Textual-free).

``None`` means "let the planner choose". Every change re-plans at once, before anything loads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from homelab.settings import COMPARED_KV_TYPES

AUTO = "auto"
KV_CHOICES = COMPARED_KV_TYPES
CONTEXT_CHOICES = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
SLOT_CHOICES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Knobs:
    quant: str | None = None
    kv_type: str | None = None  # both K and V (matched pairs are the fast ones on CUDA)
    n_ctx_per_slot: int | None = None
    n_parallel: int | None = None

    def with_value(self, name: str, raw: str) -> Knobs:
        """``raw`` as a Select holds it: "auto" or the value as text."""
        value: str | int | None = None
        if raw != AUTO:
            value = int(raw) if name in ("n_ctx_per_slot", "n_parallel") else raw
        changes: dict[str, Any] = {name: value}
        return replace(self, **changes)

    def describe(self) -> str:
        chosen = [f"{name}={value}" for name, value in vars(self).items() if value is not None]
        return ", ".join(chosen) or "all automatic"


def cycle(current: object, choices: tuple[object, ...]) -> object:
    """The next value after ``current`` in AUTO, *choices*, back to AUTO."""
    ring = (None, *choices)
    index = ring.index(current) if current in ring else 0
    return ring[(index + 1) % len(ring)]
