"""A slot that never frees (issue 39): whatever goes wrong while a request is admitted (a
restore reading a state file the writer is deleting, a bug) fails that request with an
error and frees its slot; the next request is served.

The race itself (the writer unlinking between the store's lock and its read) cannot be timed
from a test: the restore is made to raise instead, on a real engine and a real prompt cache.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import tiny_settings

from homelab.engine.api import GenerationRequest, SamplingParams
from homelab.engine.engine import Engine
from homelab.engine.prompt_cache.store import CacheConfig, PromptCache
from homelab.units import MIB

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)
OTHER = "an unrelated question about the weather in a city far away " * 3
LONG = "the agent reads the layer map, then the scheduler, then the slot table; " * 12


def test_a_failed_admission_fails_its_request_and_frees_the_slot(
    demo_model: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = PromptCache(CacheConfig(64 * MIB, 256 * MIB, tmp_path, min_tokens=32))
    engine = Engine.load(
        demo_model("llama"), tiny_settings(1, 512), record_calibration=False, prompt_cache=cache
    )
    try:
        engine.submit(GenerationRequest("alice", LONG, GREEDY)).collect()
        engine.submit(GenerationRequest("bob", OTHER, GREEDY)).collect()  # alice's state saved

        def vanished(*_: Any) -> Any:
            raise FileNotFoundError("the writer deleted the state file")

        with monkeypatch.context() as patch:
            patch.setattr(cache, "load", vanished)
            failed = engine.submit(GenerationRequest("alice", LONG, GREEDY))
            completion = failed.collect()
        assert completion.finish.reason == "error"
        assert "admitting" in (completion.finish.error or "")
        served = engine.submit(GenerationRequest("carol", "hello there", GREEDY)).collect()
        assert served.finish.reason in ("length", "stop")
        assert engine.metrics().active_slots == 0
    finally:
        engine.close()
        cache.close()
