"""Streaming: cancellation, stop strings across tokens, intact UTF-8, asyncio iteration."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from engine_helpers import EngineFactory, collect_async

from homelab.engine.api import FinishEvent, GenerationRequest, SamplingParams, TokenEvent
from homelab.engine.engine import Engine
from homelab.engine.handle import Completion

GREEDY = SamplingParams(temperature=0.0, max_tokens=48)
PROMPTS = ("hello world", "the model", "one two three", "what is the speed", "water air")


def test_cancel_frees_the_slot_within_one_step(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=1)
    handle = engine.submit(GenerationRequest("a", "hello", SamplingParams(max_tokens=400)))
    stream = iter(handle)
    for _ in range(3):
        assert isinstance(next(stream), TokenEvent)
    steps_at_cancel = engine.metrics().steps_total
    handle.cancel()
    rest = list(stream)
    finish = rest[-1]
    assert isinstance(finish, FinishEvent) and finish.reason == "cancelled"
    assert engine.metrics().steps_total - steps_at_cancel <= 1
    assert not any(state.busy for state in engine.slot_states())
    follow = engine.submit(GenerationRequest("b", "hello", GREEDY)).collect()
    assert follow.finish.reason == "length"
    assert follow.finish.stats.queue_s < 1.0


def test_a_handle_is_one_stream_that_can_be_resumed(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=1)
    handle = engine.submit(GenerationRequest("a", "hello", GREEDY))
    for _event in handle:
        break  # leaving a loop does not cancel: the rest is still there
    rest = list(handle)
    assert isinstance(rest[-1], FinishEvent) and rest[-1].reason == "length"
    assert len(rest) == GREEDY.max_tokens  # the first token was taken above
    assert list(handle) == []


def test_cancel_while_waiting_in_the_queue(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=1)
    busy = engine.submit(GenerationRequest("a", "hello", SamplingParams(max_tokens=400)))
    next(iter(busy))
    queued = engine.submit(GenerationRequest("b", "hello", GREEDY))
    queued.cancel()
    finish = queued.collect().finish
    assert finish.reason == "cancelled"
    assert finish.stats.completion_tokens == 0
    busy.cancel()


def _stop_spanning_a_boundary(texts: list[str]) -> str | None:
    """A 3-4 character string whose first occurrence in the output spans two tokens."""
    full = "".join(texts)
    boundaries, offset = set(), 0
    for text in texts:
        offset += len(text)
        boundaries.add(offset)
    for left, right in itertools.pairwise(texts):
        candidate = left[-2:] + right[:2]
        if len(candidate) < 3 or "\ufffd" in candidate:
            continue
        start = full.index(candidate)
        if any(start < b < start + len(candidate) for b in boundaries):
            return candidate
    return None


def _stream(engine: Engine, prompt: str, sampling: SamplingParams) -> tuple[list[str], FinishEvent]:
    texts: list[str] = []
    for event in engine.submit(GenerationRequest("a", prompt, sampling)):
        if isinstance(event, FinishEvent):
            return texts, event
        texts.append(event.text)
    raise AssertionError("no FinishEvent")


def test_stop_string_split_across_tokens_is_caught_and_not_emitted(engine: Engine) -> None:
    for prompt in PROMPTS:
        plain_texts, _ = _stream(engine, prompt, GREEDY)
        stop = _stop_spanning_a_boundary(plain_texts)
        if stop is None:
            continue
        plain = "".join(plain_texts)
        sampling = SamplingParams(temperature=0.0, max_tokens=48, stop=("never-happens", stop))
        texts, finish = _stream(engine, prompt, sampling)
        assert "".join(texts) == plain[: plain.index(stop)]
        assert all(stop not in text for text in texts)
        assert finish.reason == "stop"
        return
    pytest.fail("no greedy output had adjacent printable tokens to build a stop string from")


def test_text_held_back_for_a_possible_stop_is_released_at_the_end(engine: Engine) -> None:
    plain = engine.submit(GenerationRequest("a", "hello world", GREEDY)).collect()
    last_char = plain.text[-1]  # held back until the end: it could start the stop string
    sampling = SamplingParams(temperature=0.0, max_tokens=48, stop=(last_char + "\x00never",))
    held = engine.submit(GenerationRequest("a", "hello world", sampling)).collect()
    assert held.text == plain.text
    assert held.finish.reason == "length"


MULTIBYTE = "héllo wörld ✓ 日本語 🙂"


def test_multibyte_characters_stream_intact(engine: Engine) -> None:
    grammar = f'root ::= "{MULTIBYTE}"'
    sampling = SamplingParams(temperature=0.0, max_tokens=64, grammar=grammar)
    handle = engine.submit(GenerationRequest("a", "hello", sampling))
    events = [event for event in handle if isinstance(event, TokenEvent)]
    texts = [event.text for event in events]
    assert "".join(texts) == MULTIBYTE
    assert all("\ufffd" not in text for text in texts)
    assert "" in texts  # some character really was split across tokens (bytes held back)
    byte_lengths = [len(engine.detokenize([event.token_id]).encode()) for event in events]
    assert sum(byte_lengths) >= len(MULTIBYTE.encode()) - 8  # (sanity: tokens cover the bytes)


async def test_async_iteration_does_not_block_the_event_loop(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=2)
    ticks = 0
    stop_ticking = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop_ticking.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    async def consume(prompt: str) -> Completion:
        handle = engine.submit(GenerationRequest("a", prompt, GREEDY))
        return await collect_async(handle)

    tick_task = asyncio.create_task(ticker())
    first, second = await asyncio.gather(consume("hello world"), consume("the model"))
    stop_ticking.set()
    await tick_task
    assert ticks > 5
    sync_first = engine.submit(GenerationRequest("b", "hello world", GREEDY)).collect()
    assert first.token_ids == sync_first.token_ids
    assert first.finish.reason == second.finish.reason == "length"


async def test_cancelled_async_consumer_cancels_the_request(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=1)
    long_answer = SamplingParams(max_tokens=400, ignore_eos=True)
    handle = engine.submit(GenerationRequest("a", "hello", long_answer))
    streaming = asyncio.Event()

    async def consume() -> None:
        async for _event in handle.events():  # the task only ever waits inside the iteration
            streaming.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(streaming.wait(), timeout=30)  # mid-stream, not before or after
    task.cancel()  # what the server sees when a client disconnects
    with pytest.raises(asyncio.CancelledError):
        await task
    assert handle.cancelled
    follow = await collect_async(engine.submit(GenerationRequest("b", "hello", GREEDY)))
    assert follow.finish.reason == "length"
    assert follow.finish.stats.queue_s < 1.0


async def test_closing_the_async_iterator_early_cancels(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=1)
    handle = engine.submit(GenerationRequest("a", "hello", SamplingParams(max_tokens=400)))
    stream = handle.events()
    await anext(stream)
    await stream.aclose()  # type: ignore[attr-defined]
    assert handle.cancelled
    finish = [event async for event in handle.events()][-1]
    assert isinstance(finish, FinishEvent) and finish.reason == "cancelled"


async def test_a_whole_response_reader_is_woken_once_not_per_token(
    make_engine: EngineFactory,
) -> None:
    """A non-streaming request used to schedule a loop wake-up for every token (a self-pipe
    write and a loop turn each); now its reader is woken at the finish and reads them all."""
    engine = make_engine(n_parallel=1)
    wakes = {"whole": 0, "stream": 0}

    def counted(handle: object, kind: str) -> None:
        original = handle._set_async_wake  # type: ignore[attr-defined]

        def wake() -> None:
            wakes[kind] += 1
            original()

        handle._set_async_wake = wake  # type: ignore[attr-defined]

    request = GenerationRequest("a", "hello world", GREEDY)
    whole = engine.submit(request)
    counted(whole, "whole")
    completion = await collect_async(whole)
    stream = engine.submit(request)
    counted(stream, "stream")
    streamed = [event async for event in stream.events()]
    assert len(completion.token_ids) == GREEDY.max_tokens
    assert completion.token_ids == tuple(e.token_id for e in streamed if isinstance(e, TokenEvent))
    assert wakes["whole"] <= 1
    assert wakes["stream"] > 1  # a streaming reader is woken as tokens come: the count is real
    assert wakes["stream"] <= GREEDY.max_tokens + 1
