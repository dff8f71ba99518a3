"""Engine metrics reach subscribers at a steady rate; per-request stats add up."""

from __future__ import annotations

import itertools
import threading
import time

from engine_helpers import EngineFactory

from homelab.engine.api import EngineMetrics, GenerationRequest, SamplingParams


def test_subscribers_get_snapshots_at_their_rate_while_idle_and_busy(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(n_parallel=2)
    seen: list[tuple[float, EngineMetrics, str]] = []
    unsubscribe = engine.subscribe(
        lambda m: seen.append((time.perf_counter(), m, threading.current_thread().name)), 0.05
    )
    time.sleep(0.3)  # idle: snapshots keep coming
    idle_count = len(seen)
    long_answer = SamplingParams(max_tokens=480, ignore_eos=True)  # keeps both slots busy
    handles = [
        engine.submit(GenerationRequest(f"t{i}", "hello world", long_answer)) for i in range(2)
    ]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(
        m.active_slots == 2 and m.decode_tok_s > 0 for _, m, _ in seen[idle_count:]
    ):
        time.sleep(0.02)
    busy_snapshots = [m for _, m, _ in seen[idle_count:]]
    for handle in handles:
        handle.cancel()
        handle.collect()
    unsubscribe()
    count = len(seen)
    time.sleep(0.15)
    assert len(seen) == count  # unsubscribed: nothing more
    assert 2 <= idle_count <= 9
    assert {name for _, _, name in seen} == {"llama.cpp compute lane"}
    gaps = [b - a for (a, _, _), (b, _, _) in itertools.pairwise(seen)]
    assert max(gaps) < 0.5  # steady, even while decoding
    assert any(m.active_slots == 2 and m.decode_tok_s > 0 for m in busy_snapshots)
    assert all(m.n_slots == 2 for _, m, _ in seen)


def test_snapshot_counts_requests_slots_and_cells(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=2, ctx_per_slot=512)
    done = engine.submit(
        GenerationRequest("a", "hello world", SamplingParams(max_tokens=10))
    ).collect()
    metrics = engine.metrics()
    stats = done.finish.stats
    assert metrics.requests_total == 1
    assert metrics.requests_by_status == {"length": 1}
    assert metrics.active_slots == 0
    assert metrics.kv_cells_total == 1024
    assert metrics.kv_cells_used == stats.prompt_tokens + stats.completion_tokens - 1
    assert metrics.last_ttft_s == stats.ttft_s
    assert metrics.prefill_tokens_total == stats.prompt_tokens
    assert metrics.decode_tokens_total == stats.completion_tokens - 1


def test_request_stats_are_consistent(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=1)
    done = engine.submit(
        GenerationRequest("a", "the model " * 20, SamplingParams(max_tokens=20))
    ).collect()
    stats = done.finish.stats
    assert stats.prompt_tokens == len(engine.tokenize("the model " * 20))
    assert stats.completion_tokens == 20
    assert 0 < stats.queue_s <= stats.ttft_s
    assert stats.prefill_tok_s > 0 and stats.decode_tok_s > 0


def test_a_failing_subscriber_does_not_stop_the_engine(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=1)

    def broken(_: EngineMetrics) -> None:
        raise RuntimeError("subscriber bug")

    engine.subscribe(broken, 0.05)
    time.sleep(0.12)
    done = engine.submit(GenerationRequest("a", "hello", SamplingParams(max_tokens=5))).collect()
    assert done.finish.reason == "length"
