"""Engine fixtures: real llama.cpp engines on generated tiny demo models (load in ms)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import EngineFactory, tiny_settings

from homelab.engine.engine import Engine


@pytest.fixture
def make_engine(demo_model: Callable[..., Path]) -> Iterator[EngineFactory]:
    """``make_engine(arch="llama", n_parallel=4, **settings_or_engine_options)``."""
    engines: list[Engine] = []

    def make(
        arch: str = "llama", n_parallel: int = 4, ctx_per_slot: int = 512, **options: Any
    ) -> Engine:
        engine_keys = {"queue_limit", "prefill_chunk_tokens", "on_oom_ladder", "record_calibration"}
        engine_options = {k: options.pop(k) for k in list(options) if k in engine_keys}
        engine_options.setdefault("record_calibration", False)  # keep the shared data dir clean
        settings = tiny_settings(n_parallel, ctx_per_slot, **options)
        engine = Engine.load(demo_model(arch), settings, **engine_options)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


@pytest.fixture
def engine(make_engine: EngineFactory) -> Engine:
    return make_engine()
