"""Every demo architecture runs under continuous batching with the same greedy results."""

from __future__ import annotations

import pytest
from engine_helpers import EngineFactory
from test_batching import assert_same_greedy

from homelab.engine.api import GenerationRequest, SamplingParams
from homelab.gguf.generator import ARCHS

PROMPTS = ("hello world", "the model reads the cache", "one two three four")


@pytest.mark.parametrize("arch", ARCHS)
def test_architecture_batches_like_it_runs_alone(make_engine: EngineFactory, arch: str) -> None:
    engine = make_engine(arch, n_parallel=3)
    sampling = SamplingParams(temperature=0.0, max_tokens=12, logprobs=2)
    alone = [
        engine.submit(GenerationRequest(f"alone{i}", p, sampling)).collect()
        for i, p in enumerate(PROMPTS)
    ]
    handles = [
        engine.submit(GenerationRequest(f"batch{i}", p, sampling)) for i, p in enumerate(PROMPTS)
    ]
    together = [handle.collect() for handle in handles]
    compared = sum(assert_same_greedy(a, b) for a, b in zip(alone, together, strict=True))
    assert compared >= 24
    warm = engine.submit(GenerationRequest("batch0", PROMPTS[0], sampling)).collect()
    assert warm.token_ids == alone[0].token_ids
    if arch == "mamba":  # recurrent: prefix reuse is off (llama.cpp cannot trim the state)
        assert warm.finish.stats.cached_tokens == 0
    else:
        assert warm.finish.stats.cached_tokens > 0
