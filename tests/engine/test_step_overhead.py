"""homelab's own work per generated token, counted (not timed): a 2x regression fails here.

At GPU step times (a few ms per token, ~0.3 ms on the tiny demo model here) the engine's own
work is what separates it from llama.cpp's C++ loop. Two costs are counted while one stream
generates, on a real engine and a generated tiny model:

- **thread hand-offs**: each engine is a resident of the compute lane, so its
  ``llama_decode`` is a direct call. A hand-off (a decode queued for another thread, the
  caller blocked until it returns) costs two wake-ups per step; on a loaded 2-core machine it
  ran at 0.65x the speed. Counted as decodes handed to the lane from another thread, and as
  the lane thread's voluntary context switches (it blocks once per step with a hand-off);
- **Python calls per token** on the lane (sys.setprofile, the calls of every step and of the
  C functions they call): 16 today at one stream, 8 a token at eight; the budgets are
  twice that.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from engine_helpers import EngineFactory, tiny_settings

from homelab.engine import scheduler
from homelab.engine.api import FinishEvent, GenerationRequest, SamplingParams, TokenEvent
from homelab.engine.engine import Engine
from homelab.engine.handle import RequestHandle
from homelab.llamacpp import lane

N_TOKENS = 256
CALLS_PER_TOKEN_BUDGET = 35  # measured 16 (greedy, one stream, tiny model; 18 before a
# steady step stopped flushing the wakes when none were gathered, 44 before a
# generating step went on to the next without the lane and a greedy text token was handed
# over in the step's own loop; 89-90 before
# the meter summed steps per time bucket and occupancy was read at snapshot time, 66 before
# the lane stopped locking when nothing was new and an engine's decode became a direct call,
# 55 before a step in which every sequence generates took a shortcut of its own)
CALLS_PER_SEQUENCE_TOKEN_BUDGET = 16  # measured 8 at eight sequences (17 before)
SWITCHES_PER_TOKEN_LIMIT = 0.25  # measured 0.004; a hand-off per step gives about 1


def generate(engine: Engine, prompt: str) -> None:
    sampling = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)
    finish = engine.submit(GenerationRequest("overhead", prompt, sampling)).collect().finish
    assert finish.stats.completion_tokens == N_TOKENS


@pytest.fixture
def warm_engine(make_engine: EngineFactory) -> Engine:
    engine = make_engine(n_parallel=1, ctx_per_slot=1024)
    generate(engine, "warm up")  # graphs built, samplers and caches allocated
    return engine


@pytest.fixture
def handoffs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Calls queued for the lane from another thread (decodes included)."""
    queued: list[int] = []
    real_run = lane._LANE.run

    def counting_run(function: Callable[[], Any]) -> Any:
        if not lane.on_lane():
            queued.append(threading.get_ident())
        return real_run(function)

    monkeypatch.setattr(lane._LANE, "run", counting_run)
    yield queued


def lane_switches() -> tuple[int, int]:
    """(voluntary, involuntary) context switches of the lane thread so far (Linux /proc)."""
    thread = lane._LANE.thread
    assert thread is not None and thread.native_id is not None
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if "ctxt_switches" in line)
    return int(fields["voluntary_ctxt_switches"]), int(fields["nonvoluntary_ctxt_switches"])


def test_an_engine_decodes_on_the_lane_without_a_hand_off(
    warm_engine: Engine, handoffs: list[int]
) -> None:
    voluntary_before, _ = lane_switches()
    generate(warm_engine, "hello world")
    voluntary_after, _ = lane_switches()
    assert handoffs == []
    assert (voluntary_after - voluntary_before) / N_TOKENS < SWITCHES_PER_TOKEN_LIMIT


def test_python_calls_per_token_stay_within_budget(warm_engine: Engine) -> None:
    per_token = calls_per_token(warm_engine, 1)
    assert per_token < CALLS_PER_TOKEN_BUDGET, f"{per_token:.0f} Python calls per token"


def test_an_idle_engine_beside_it_does_not_add_to_the_calls_per_token(
    warm_engine: Engine, make_engine: EngineFactory
) -> None:
    """A second engine loaded and idle (a fleet's other model, an embedding model): the
    generating one still steps again without going back to the lane (37 calls a token
    when any other resident made it go back every step)."""
    idle = make_engine(n_parallel=1)
    generate(idle, "it ran once, and waits")
    per_token = calls_per_token(warm_engine, 1)
    assert per_token < CALLS_PER_TOKEN_BUDGET, f"{per_token:.0f} Python calls per token"


def test_python_calls_per_token_of_eight_sequences_stay_within_budget(
    make_engine: EngineFactory,
) -> None:
    """The work per sequence in a step (batch row, sampling, emitting) counted on its own:
    at eight sequences the step's fixed calls are shared."""
    engine = make_engine(n_parallel=8, ctx_per_slot=512)
    calls_per_token(engine, 8)  # warm: every slot's graphs and samplers made
    per_token = calls_per_token(engine, 8)
    assert per_token < CALLS_PER_SEQUENCE_TOKEN_BUDGET, f"{per_token:.0f} calls per token"


def calls_per_token(engine: Engine, n_sequences: int) -> float:
    """Python calls on the lane (and the C functions they call) per generated token, while
    ``n_sequences`` greedy requests of ``N_TOKENS`` each generate together."""
    calls = [0]

    def count(frame: FrameType, event: str, arg: object) -> None:
        if event in ("call", "c_call"):
            calls[0] += 1

    sampling = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)
    engine.run_on_engine_thread(lambda: sys.setprofile(count)).result(10)
    try:
        handles = [
            engine.submit(GenerationRequest(f"calls-{i}", f"hello world {i}", sampling))
            for i in range(n_sequences)
        ]
        for handle in handles:
            assert handle.collect().finish.stats.completion_tokens == N_TOKENS
    finally:
        engine.run_on_engine_thread(lambda: sys.setprofile(None)).result(10)
    return calls[0] / (N_TOKENS * n_sequences)


def read_streaming(
    engine: Engine, requests: list[GenerationRequest]
) -> tuple[list[list[TokenEvent]], int]:
    """The token events of each request, read by one event loop as streaming responses read
    them (``events()``), and how many times the engine woke that loop."""
    wakes = [0]

    async def read_all() -> list[list[TokenEvent]]:
        loop = asyncio.get_running_loop()
        real_call_soon_threadsafe = loop.call_soon_threadsafe

        def counting(callback: Callable[..., object], *args: object) -> asyncio.Handle:
            wakes[0] += 1
            return real_call_soon_threadsafe(callback, *args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        handles = [engine.submit(request) for request in requests]

        async def read(handle: RequestHandle) -> list[TokenEvent]:
            return [event async for event in handle.events() if isinstance(event, TokenEvent)]

        return list(await asyncio.gather(*(read(handle) for handle in handles)))

    return asyncio.run(read_all()), wakes[0]


def test_streaming_readers_on_one_loop_are_woken_once_per_step(make_engine: EngineFactory) -> None:
    """Eight streams read by one event loop: one self-pipe wake per step for all of them
    (one per stream per token, 8x, before the step gathered them)."""
    engine = make_engine(n_parallel=8, ctx_per_slot=256)
    sampling = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    requests = [GenerationRequest(f"stream-{i}", f"stream {i}", sampling) for i in range(8)]
    steps_before = engine.metrics().steps_total
    streams, wakes = read_streaming(engine, requests)
    assert [len(events) for events in streams] == [64] * 8
    steps = engine.metrics().steps_total - steps_before
    assert wakes <= steps + 8, (wakes, steps)  # 8: admissions may wake outside a step


def test_steady_steps_wake_a_streaming_reader_at_most_once_an_interval(
    warm_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the same sequence steps again and again, its reader's loop is woken no more
    often than ``STREAM_WAKE_INTERVAL_S`` (a wake a token cost the loop ~30 µs, which on two
    cores the decode waited for) and takes what came meanwhile: the same tokens, in order.
    With the interval made a minute long, the wakes left are the lane's own ends of a step
    (the first token, metrics due, the finish): a handful, not one a token."""
    sampling = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)
    request = GenerationRequest("steady", "hello world", sampling)
    expected = warm_engine.submit(request).collect()
    monkeypatch.setattr(scheduler, "STREAM_WAKE_INTERVAL_S", 0.0)  # every steady step wakes
    (events,), wakes = read_streaming(warm_engine, [request])
    assert [event.token_id for event in events] == list(expected.token_ids)
    assert wakes > N_TOKENS // 8, wakes  # about one a token: the count below can tell
    monkeypatch.setattr(scheduler, "STREAM_WAKE_INTERVAL_S", 60.0)
    (events,), wakes = read_streaming(warm_engine, [request])
    assert [event.token_id for event in events] == list(expected.token_ids)
    assert "".join(event.text for event in events) == expected.text
    assert wakes <= N_TOKENS // 8, wakes


def test_a_chunked_reader_is_not_woken_per_token(warm_engine: Engine) -> None:
    """``chunks``: the first token wakes the reader at once; the rest are taken in lists
    every ``interval_s`` (what ``homelab run`` does: a reader woken per token takes a core from
    the decode on a small machine). Same events as iterating the handle one by one."""
    sampling = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)
    request = GenerationRequest("chunks", "hello world", sampling)
    expected = warm_engine.submit(request).collect()
    lists = list(warm_engine.submit(request).chunks(interval_s=0.25))
    events = [event for events in lists for event in events]
    tokens = [event.token_id for event in events if isinstance(event, TokenEvent)]
    assert tokens == list(expected.token_ids)
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == expected.text
    assert isinstance(lists[-1][-1], FinishEvent)
    assert not any(isinstance(event, FinishEvent) for event in events[:-1])
    assert len(lists[0]) < N_TOKENS  # the reader saw the first tokens before the end
    # 256 tokens take ~0.1-0.5 s here: woken per token, 256 lists; at 0.25 s, a handful
    assert len(lists) <= 8, [len(events) for events in lists]


def test_a_loaded_engine_keeps_the_collector_off_the_loaded_heap(
    make_engine: EngineFactory,
) -> None:
    """A full collection walks every object of the process on the compute lane (20-35 ms:
    whole steps); a loaded engine freezes what exists, closing it unfreezes."""
    gc.unfreeze()
    engine = make_engine(n_parallel=1)
    assert gc.get_freeze_count() > 10_000  # the imports, the test session, the engine
    engine.close()
    assert gc.get_freeze_count() == 0


def test_loading_collects_what_a_closed_engine_left_before_freezing(
    demo_model: Callable[..., Path],
) -> None:
    """The cycles a closed engine leaves (scheduler, batches, model header) are collected by
    the next load, not frozen for good with the rest of the heap: frozen, they grew a server
    that yields and resumes by ~1 MiB a cycle (issue #41)."""
    gc.unfreeze()
    settings = tiny_settings(n_parallel=1, ctx_per_slot=512)
    first = Engine.load(demo_model("llama"), settings, record_calibration=False)
    closed = weakref.ref(first)
    first.close()
    del first
    second = Engine.load(demo_model("llama"), settings, record_calibration=False)
    try:
        assert closed() is None
    finally:
        second.close()
