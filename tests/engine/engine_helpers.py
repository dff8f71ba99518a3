"""Helpers shared by the engine tests (imported by name: tests/ is not a package)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from homelab.engine.engine import Engine
from homelab.settings import Settings

EngineFactory = Callable[..., Engine]


def tiny_settings(n_parallel: int = 4, ctx_per_slot: int = 512, **changes: Any) -> Settings:
    fields: dict[str, Any] = {
        "n_ctx": ctx_per_slot * n_parallel,
        "n_ctx_per_slot": ctx_per_slot,
        "n_parallel": n_parallel,
        "n_batch": 512,
        "n_ubatch": 256,
        "n_threads": 1,
    }
    fields.update(changes)
    return Settings(**fields)
