"""Helpers shared by the engine tests (imported by name: tests/ is not a package)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

from homelab.engine.engine import Engine
from homelab.engine.handle import Completion, RequestHandle
from homelab.llamacpp.batch import Batch
from homelab.llamacpp.context import Context
from homelab.settings import Settings

EngineFactory = Callable[..., Engine]
Decode = Callable[[Context, Batch], int]


def wrap_decode(monkeypatch: pytest.MonkeyPatch, wrapper: Callable[[Decode], Decode]) -> None:
    """Every ``llama_decode`` of every engine through ``wrapper(real decode)``: the steps
    that call ``Context.decode`` and the steady greedy steps, which bind
    ``Context.decoder(batch)`` once and call it step after step."""
    wrapped = wrapper(Context.decode)

    def decoder(context: Context, batch: Batch) -> Callable[[], int]:
        return functools.partial(wrapped, context, batch)

    monkeypatch.setattr(Context, "decode", wrapped)
    monkeypatch.setattr(Context, "decoder", decoder)


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


async def collect_async(handle: RequestHandle) -> Completion:
    """The whole completion of ``handle``, read in asyncio as a whole-response server reads
    it (``all_events``: the loop woken once, at the end)."""
    return Completion.of(await handle.all_events())
