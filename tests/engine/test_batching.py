"""Continuous batching gives the same greedy results as running requests one at a time."""

from __future__ import annotations

import pytest
from engine_helpers import Decode, EngineFactory, wrap_decode

from homelab.engine.api import GenerationRequest, SamplingParams, TokenLogprob
from homelab.engine.engine import Engine
from homelab.engine.handle import Completion, RequestHandle
from homelab.llamacpp.batch import Batch
from homelab.llamacpp.context import Context

# Below this gap (in logprob) between the two best tokens, a different batch shape may
# legitimately pick the other one: float sums are not associative.
NEAR_TIE = 0.02
LOGPROB_TOLERANCE = 0.05

PROMPTS = [
    "the model reads the cache",
    "hello world, what is the speed of a token",
    "water, air and earth are" * 3,
    "one two three",
    "the quant of the layer is" * 6,
    "yes",
]


def _margin(logprob: TokenLogprob) -> float:
    return logprob.top[0][1] - logprob.top[1][1]


def assert_same_greedy(reference: Completion, candidate: Completion) -> int:
    """Compare token by token while the reference's choice is clear; return tokens compared."""
    compared = 0
    for ref_id, cand_id, ref_lp, cand_lp in zip(
        reference.token_ids,
        candidate.token_ids,
        reference.logprobs,
        candidate.logprobs,
        strict=False,
    ):
        assert ref_lp is not None and cand_lp is not None
        if ref_id != cand_id:
            assert _margin(ref_lp) < NEAR_TIE, (
                f"token {compared} differs although its margin was {_margin(ref_lp):.3f}"
            )
            return compared  # after a legitimate flip the continuations diverge
        assert abs(ref_lp.logprob - cand_lp.logprob) < LOGPROB_TOLERANCE
        compared += 1
    assert len(reference.token_ids) == len(candidate.token_ids)
    return compared


def test_concurrent_requests_match_sequential_ones(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=4, prefill_chunk_tokens=16)
    sampling = SamplingParams(temperature=0.0, max_tokens=24, logprobs=2)
    # distinct tenants per run: no prefix cache hit mixes into this comparison
    one_at_a_time = [
        engine.submit(GenerationRequest(f"alone-{i}", p, sampling)).collect()
        for i, p in enumerate(PROMPTS)
    ]
    handles = [  # 6 requests for 4 slots: two wait and join as others finish
        engine.submit(GenerationRequest(f"together-{i}", p, sampling))
        for i, p in enumerate(PROMPTS)
    ]
    together = [handle.collect() for handle in handles]
    compared = sum(
        assert_same_greedy(alone, batched)
        for alone, batched in zip(one_at_a_time, together, strict=True)
    )
    assert compared >= 0.8 * 24 * len(PROMPTS)  # the comparison really happened
    assert all(c.finish.reason == "length" for c in together)


def test_batching_really_overlaps_requests(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=4)
    sampling = SamplingParams(temperature=0.0, max_tokens=32)
    steps_before = engine.metrics().steps_total
    handles = [engine.submit(GenerationRequest(f"t{i}", PROMPTS[i], sampling)) for i in range(4)]
    for handle in handles:
        handle.collect()
    steps = engine.metrics().steps_total - steps_before
    assert steps < 2 * 32  # four sequences of 32 tokens would need >= 128 steps one by one


def test_long_prompt_is_prefilled_in_chunks_without_stalling_others(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(n_parallel=2, ctx_per_slot=1024, prefill_chunk_tokens=32)
    sampling = SamplingParams(temperature=0.0, max_tokens=40)
    running = engine.submit(GenerationRequest("a", "hello", sampling))
    stream = iter(running)
    next(stream)  # "a" is generating
    long_prompt = tuple(range(10, 10 + 600))
    late = engine.submit(GenerationRequest("b", long_prompt, SamplingParams(max_tokens=1)))
    tokens_while_prefilling = 0
    for _ in stream:
        if late_done(late):
            break
        tokens_while_prefilling += 1
    assert tokens_while_prefilling >= 600 // 32 - 2  # "a" kept generating during b's prefill
    running.cancel()


def late_done(handle: RequestHandle) -> bool:
    return handle.finished


@pytest.fixture
def decoded_ids(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The sequence id of every row of every decode from now on, batch by batch."""
    seen: list[list[int]] = []

    def wrapper(decode: Decode) -> Decode:
        def spy(context: Context, batch: Batch) -> int:
            seen.append([batch.c_batch.seq_id[row][0] for row in range(batch.n_tokens)])
            return decode(context, batch)

        return spy

    wrap_decode(monkeypatch, wrapper)
    return seen


def generate_with_a_latecomer(engine: Engine, n_requests: int) -> None:
    """``n_requests`` requests (another tenant each: nothing reusable) of which the second
    ends after 2 tokens; once it has, a latecomer joins the others still generating."""
    long = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    short = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    handles = [
        engine.submit(GenerationRequest(f"t{i}", f"request {i}", short if i == 1 else long))
        for i in range(n_requests)
    ]
    handles[1].collect()  # its slot is free while the others still generate
    late = engine.submit(GenerationRequest("late", "a latecomer", long))
    for handle in [*handles[:1], *handles[2:], late]:
        assert handle.collect().finish.reason == "length"


def test_every_decode_lists_its_sequences_in_slot_order(
    make_engine: EngineFactory, decoded_ids: list[list[int]]
) -> None:
    """With a cache stream per slot, llama.cpp computes a batch as one graph only while each
    token's sequence id follows the previous one; out of order it splits the batch (8 slots,
    one pair swapped: 1.6x the time here). A request that takes a slot freed in the middle
    joins the end of the generating list — the batch must still be in slot order."""
    generate_with_a_latecomer(make_engine(n_parallel=4), 4)
    steps = [ids for ids in decoded_ids if len(set(ids)) > 1]
    assert len({tuple(dict.fromkeys(ids)) for ids in steps}) > 1  # the set of sequences changed
    for ids in steps:
        assert ids == sorted(ids), ids


def test_a_request_that_reuses_nothing_fills_the_gap_between_busy_slots(
    make_engine: EngineFactory, decoded_ids: list[list[int]]
) -> None:
    """With a cache stream per slot, llama.cpp computes one graph per run of consecutive
    sequence ids: a newcomer takes the free slot between two generating ones, not the next
    empty slot, so that the step stays one run (slots 0, 2, 3 would be two graphs a step)."""
    generate_with_a_latecomer(make_engine(n_parallel=6), 3)  # slot 1 frees between 0 and 2
    three = [sorted(set(ids)) for ids in decoded_ids if len(set(ids)) == 3]
    assert three, "the latecomer never generated beside the other two"
    assert all(ids == [0, 1, 2] for ids in three), three
