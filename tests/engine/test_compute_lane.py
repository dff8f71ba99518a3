"""Every llama_decode of the process runs on one thread (``homelab.llamacpp.lane``).

libgomp keeps an OpenMP team per calling thread; with more teams than CPUs it stops spinning
at ggml's per-node barriers and sleeps on a futex, which halved 1-stream decode on 2 cores as
soon as a second engine had decoded once on its own scheduler thread. Real llama.cpp engines
on generated tiny models; no timing is asserted.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from homelab.engine.api import GenerationRequest, SamplingParams
from homelab.engine.embeddings import Embedder, EmbeddingOptions
from homelab.llamacpp import lane
from homelab.llamacpp._lib import lib


@pytest.fixture
def decode_threads(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The ids of the threads that ran a ``llama_decode`` (engines decode on the lane by a
    direct call, others hand it to the lane: the call itself is what is recorded)."""
    seen: set[int] = set()
    llama = lib()
    real_decode = llama.llama_decode

    def recorded(*args: Any) -> Any:
        seen.add(threading.get_ident())
        return real_decode(*args)

    monkeypatch.setattr(llama, "llama_decode", recorded)
    return seen


def test_two_engines_and_an_embedder_decode_on_one_thread(
    make_engine: Any, decode_threads: set[int]
) -> None:
    first, second = make_engine(), make_engine(n_parallel=2)
    sampling = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    for name, engine in (("a", first), ("b", second), ("c", first)):
        finish = engine.submit(GenerationRequest(name, "hello there", sampling)).collect().finish
        assert finish.stats.completion_tokens == 6
    with Embedder.beside(first, EmbeddingOptions(pooling="mean")) as embedder:
        assert len(embedder.embed([[5, 6, 7]])) == 1
    assert len(decode_threads) == 1
    assert decode_threads == {lane._LANE.thread.ident}  # type: ignore[union-attr]
    assert threading.get_ident() not in decode_threads


def test_a_call_on_the_lane_runs_directly_and_errors_reach_the_caller() -> None:
    own = lane.ComputeLane("test lane")
    inner_thread: list[int] = []

    def nested() -> int:
        inner_thread.append(threading.get_ident())
        return own.run(lambda: threading.get_ident())  # from the lane itself: no deadlock

    assert own.run(nested) == inner_thread[0]

    def fails() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        own.run(fails)
    assert own.run(lambda: 7) == 7  # the lane survives a failing call


def test_a_replaced_lane_serves_while_the_old_thread_is_stuck() -> None:
    own = lane.ComputeLane("test lane")
    stuck, release = threading.Event(), threading.Event()

    def hang() -> None:
        stuck.set()
        release.wait(30)

    waiter = threading.Thread(target=own.run, args=(hang,), daemon=True)
    waiter.start()
    assert stuck.wait(10)
    old = own.thread
    own.replace()
    assert own.thread is not old
    assert own.run(lambda: "served") == "served"
    release.set()
    waiter.join(10)
    assert not waiter.is_alive()


# --- an engine stepping alone (``Scheduler._generate`` steps again without the lane) --------

LONG = SamplingParams(max_tokens=1500, temperature=0.0, ignore_eos=True)


def started_stream(engine: Any) -> Any:
    """A long greedy stream, its first tokens read: its engine is stepping on its own."""
    handle = engine.submit(GenerationRequest("long", "hello world", LONG))
    events = iter(handle)
    for _ in range(5):
        next(events)
    return handle


def stop(handle: Any) -> None:
    handle.cancel()
    assert handle.collect().finish.reason in ("cancelled", "length")


def test_another_engine_is_served_while_one_generates_alone(make_engine: Any) -> None:
    """The steady steps go back to the lane as soon as it has other work: a request to a
    second engine finishes long before the stream that was generating alone."""
    first, second = make_engine(n_parallel=1, ctx_per_slot=2048), make_engine(n_parallel=1)
    long = started_stream(first)
    short = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    finish = second.submit(GenerationRequest("short", "hi", short)).collect().finish
    assert finish.stats.completion_tokens == 4
    assert not long.finished  # 1,500 tokens: the lane went between the two engines
    stop(long)


def test_a_call_between_steps_runs_while_a_stream_generates(make_engine: Any) -> None:
    engine = make_engine(n_parallel=1, ctx_per_slot=2048)
    long = started_stream(engine)
    assert engine.run_on_engine_thread(lambda: threading.get_ident()).result(10) == (
        lane._LANE.thread.ident  # type: ignore[union-attr]
    )
    assert not long.finished
    stop(long)


def test_metrics_subscribers_are_called_on_time_while_a_stream_generates(
    make_engine: Any,
) -> None:
    engine = make_engine(n_parallel=1, ctx_per_slot=2048)
    busy: list[int] = []
    unsubscribe = engine.subscribe(lambda m: busy.append(m.active_slots), interval_s=0.05)
    handle = engine.submit(GenerationRequest("long", "hello world", LONG))
    started = time.perf_counter()
    assert handle.collect().finish.stats.completion_tokens == 1500
    generating_s = time.perf_counter() - started
    unsubscribe()
    # due every 50 ms: while the one stream generated (~0.5 s here), not only at its end
    assert busy.count(1) >= min(3, int(generating_s / 0.05) - 1), (busy, generating_s)


def test_an_idle_engine_is_stepped_when_its_metrics_are_due_while_another_streams(
    make_engine: Any,
) -> None:
    """The other engines being idle does not stop the steady steps (a fleet's second model,
    an embedding model: tests/engine/test_step_overhead.py counts that), but an idle
    engine whose metrics subscribers are due is stepped on time all the same."""
    streaming, idle = make_engine(n_parallel=1, ctx_per_slot=2048), make_engine(n_parallel=1)
    seen: list[float] = []
    unsubscribe = idle.subscribe(lambda m: seen.append(time.perf_counter()), interval_s=0.05)
    time.sleep(0.1)  # the lane has stepped the idle engine: it now waits for a time
    handle = streaming.submit(GenerationRequest("long", "hello world", LONG))
    started = time.perf_counter()
    assert handle.collect().finish.stats.completion_tokens == 1500
    ended = time.perf_counter()
    unsubscribe()
    during = [t for t in seen if started < t < ended]
    assert len(during) >= min(3, int((ended - started) / 0.05) - 1), (len(during), ended - started)
