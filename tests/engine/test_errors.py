"""Limits and failures: rejected before compute, and one request's failure stays its own."""

from __future__ import annotations

import pytest
from engine_helpers import EngineFactory

from homelab.engine.api import FinishEvent, GenerationRequest, SamplingParams, TokenEvent
from homelab.engine.engine import Engine
from homelab.errors import BusyError, ContextLengthError, EngineError

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


def test_prompt_plus_max_tokens_beyond_the_slot_is_rejected_before_compute(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(n_parallel=2, ctx_per_slot=256)
    steps = engine.metrics().steps_total
    prompt = tuple(range(10, 10 + 200))
    with pytest.raises(ContextLengthError, match="256"):
        engine.submit(GenerationRequest("a", prompt, SamplingParams(max_tokens=57)))
    assert engine.metrics().steps_total == steps
    fits = engine.submit(GenerationRequest("a", prompt, SamplingParams(max_tokens=56))).collect()
    assert fits.finish.reason in ("length", "stop")


def test_full_queue_says_busy(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=1, queue_limit=2)
    running = engine.submit(GenerationRequest("a", "hello", SamplingParams(max_tokens=400)))
    next(iter(running))  # admitted: it no longer counts against the queue
    waiting = [engine.submit(GenerationRequest("b", "hello", GREEDY)) for _ in range(2)]
    with pytest.raises(BusyError, match="busy"):
        engine.submit(GenerationRequest("c", "hello", GREEDY))
    assert engine.metrics().queue_depth == 2
    assert engine.metrics().requests_by_status.get("rejected") == 1
    running.cancel()
    assert all(handle.collect().finish.reason == "length" for handle in waiting)


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (GenerationRequest("a", (5, 99_999)), "vocabulary"),
        (GenerationRequest("a", ()), "empty"),
        (GenerationRequest("a", "hi", SamplingParams(max_tokens=0)), "max_tokens"),
        (GenerationRequest("a", "hi", SamplingParams(grammar="root ::= (")), "grammar"),
        (GenerationRequest("a", "hi", SamplingParams(logit_bias={70_000: 1.0})), "logit_bias"),
    ],
)
def test_bad_requests_fail_synchronously(
    engine: Engine, request_: GenerationRequest, message: str
) -> None:
    with pytest.raises(EngineError, match=message):
        engine.submit(request_)
    assert engine.submit(GenerationRequest("a", "hi", GREEDY)).collect().finish.reason == "length"


def test_a_llama_cpp_decode_failure_fails_only_that_request(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=2)
    long = SamplingParams(temperature=0.0, max_tokens=60)
    reference = engine.submit(GenerationRequest("ref", "hello world", long)).collect()
    # queued between two steps, so they start together, as the reference started alone (one
    # a step ahead would read its prompt in a batch of another size: other rounding, and a
    # random-weight model's greedy text may part from the reference's tens of tokens later)
    healthy, doomed = engine.run_on_engine_thread(
        lambda: (
            engine.submit(GenerationRequest("a", "hello world", long)),
            engine.submit(GenerationRequest("b", "the model", long)),
        )
    ).result(10)
    next(healthy)
    next(doomed)
    doomed_seq = next(s.seq_id for s in engine.slot_states() if s.tenant == "b")

    def corrupt() -> None:
        # drop b's last cell behind the scheduler's back: b's next position no longer
        # follows the cache's, which llama.cpp rejects
        memory = engine.context.memory
        memory.drop_from(doomed_seq, memory.last_position(doomed_seq))

    engine.run_on_engine_thread(corrupt).result(5)
    doomed_finish = doomed.collect().finish
    assert doomed_finish.reason == "error"
    assert doomed_finish.error and "decode" in doomed_finish.error
    healthy_rest = list(healthy)
    finish = healthy_rest[-1]
    assert isinstance(finish, FinishEvent) and finish.reason == "length"
    healthy_ids = [e.token_id for e in healthy_rest if isinstance(e, TokenEvent)]
    assert len(healthy_ids) == 59
    assert tuple(healthy_ids) == reference.token_ids[1:]
    after = engine.submit(GenerationRequest("c", "hello world", long)).collect()
    assert after.token_ids == reference.token_ids


def test_closed_engine_refuses_work_and_cancels_what_is_in_flight(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(n_parallel=1)
    running = engine.submit(GenerationRequest("a", "hello", SamplingParams(max_tokens=400)))
    queued = engine.submit(GenerationRequest("b", "hello", GREEDY))
    next(iter(running))
    engine.close()
    assert running.collect().finish.reason == "cancelled"
    assert queued.collect().finish.reason == "cancelled"
    with pytest.raises(EngineError, match="closed"):
        engine.submit(GenerationRequest("a", "hi", GREEDY))
