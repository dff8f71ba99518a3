"""Many short requests leave the process memory flat (no per-request leak)."""

from __future__ import annotations

import gc

import psutil
from engine_helpers import EngineFactory

from homelab.engine.api import GenerationRequest, SamplingParams

ALLOWED_GROWTH_BYTES = 6 * 1024 * 1024


def test_a_thousand_sequential_requests_leave_memory_flat(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=2)
    process = psutil.Process()
    sampling = (
        SamplingParams(max_tokens=2, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=1),
    )

    def burst(count: int, offset: int) -> None:
        for i in range(count):
            prompt = f"hello {i + offset} world"
            request = GenerationRequest(f"t{i % 5}", prompt, sampling[i % 2], request_id=f"r{i}")
            assert engine.submit(request).collect().finish.reason == "length"

    burst(200, 0)  # warm up: caches, allocator pools, the piece table
    gc.collect()
    before = process.memory_info().rss
    burst(1000, 200)
    gc.collect()
    grown = process.memory_info().rss - before
    assert engine.metrics().requests_total == 1200
    assert grown < ALLOWED_GROWTH_BYTES, f"RSS grew {grown / 2**20:.1f} MiB over 1000 requests"
