"""Greedy sequences of one step are picked with one argmax over the step's logits (issue #27).

Each sequence that samples greedily and nothing else (no grammar, penalties, biases or
log-probabilities) gets its token from one ``argmax`` over the batch's output rows instead of
a llama.cpp sampler call per sequence, which copies the whole vocabulary into a candidate
array. Asking for log-probabilities changes no choice but takes every sequence through its
sampler chain: the two ways must write the same tokens, with ``ignore_eos`` and
``min_tokens`` too.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from engine_helpers import Decode, EngineFactory, wrap_decode

from homelab.engine.api import GenerationRequest, SamplingParams
from homelab.engine.engine import Engine
from homelab.engine.handle import Completion
from homelab.llamacpp.batch import Batch
from homelab.llamacpp.context import Context
from homelab.llamacpp.sampler import SamplerChain as CChain

PROMPTS = ("The sea is", "Once upon a time", "def main():", "1, 2, 3,", "Hello", "A B C")


@pytest.fixture
def sampler_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many times a sampler chain sampled (the per-sequence path)."""
    calls: list[int] = []
    real_sample = CChain.sample

    def counting(self: CChain, context: Context, batch_index: int) -> int:
        calls.append(batch_index)
        return real_sample(self, context, batch_index)

    monkeypatch.setattr(CChain, "sample", counting)  # before the engine makes any chain
    yield calls


@pytest.fixture
def chain_calls(sampler_calls: list[int]) -> list[int]:
    return sampler_calls


def run_together(engine: Engine, **sampling: object) -> list[tuple[int, ...]]:
    """Every prompt submitted at once (one batch), greedy; the tokens of each."""
    return [completion.token_ids for completion in completions(engine, **sampling)]


def completions(engine: Engine, **sampling: object) -> list[Completion]:
    params = SamplingParams(temperature=0.0, max_tokens=24, **sampling)  # type: ignore[arg-type]
    handles = [
        engine.submit(GenerationRequest(f"greedy-{i}", prompt, params))
        for i, prompt in enumerate(PROMPTS)
    ]
    return [handle.collect() for handle in handles]


@pytest.mark.parametrize(
    "sampling",
    [{}, {"ignore_eos": True}, {"min_tokens": 12}],
    ids=["plain", "ignore_eos", "min_tokens"],
)
def test_one_argmax_for_the_batch_picks_what_each_sampler_would(
    make_engine: EngineFactory, chain_calls: list[int], sampling: dict[str, object]
) -> None:
    engine = make_engine(n_parallel=len(PROMPTS), ctx_per_slot=256)
    batched = run_together(engine, **sampling)
    assert chain_calls == []  # no sequence went through its sampler chain
    one_by_one = run_together(engine, logprobs=0, **sampling)
    assert len(chain_calls) >= sum(len(tokens) for tokens in one_by_one)
    assert batched == one_by_one
    if sampling:
        assert all(len(tokens) >= 12 for tokens in batched)


@pytest.fixture
def wants_to_end(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """After each decode, the end-of-generation tokens lead every output row by far: random
    weights never pick them, a real model at the end of its answer does."""

    def wrapper(real_decode: Decode) -> Decode:
        def decode(self: Context, batch: Batch) -> int:
            status = real_decode(self, batch)
            n_outputs = sum(batch.c_batch.logits[row] for row in range(batch.n_tokens))
            if status == 0 and n_outputs:
                logits = self.all_logits(n_outputs)
                logits[:, EOG_IDS] = logits.max(axis=1, keepdims=True) + 50.0
            return status

        return decode

    wrap_decode(monkeypatch, wrapper)
    yield


EOG_IDS: list[int] = []


@pytest.mark.parametrize(
    ("sampling", "n_tokens"),
    [({}, 1), ({"ignore_eos": True}, 24), ({"min_tokens": 12}, 13)],  # the end is counted
    ids=["plain", "ignore_eos", "min_tokens"],
)
def test_ending_is_banned_alike_on_both_ways(
    make_engine: EngineFactory,
    chain_calls: list[int],
    wants_to_end: None,
    sampling: dict[str, object],
    n_tokens: int,
) -> None:
    engine = make_engine(n_parallel=len(PROMPTS), ctx_per_slot=256)
    EOG_IDS[:] = sorted(engine.eog_tokens)
    batched = completions(engine, **sampling)
    one_by_one = completions(engine, logprobs=0, **sampling)
    assert [c.token_ids for c in batched] == [c.token_ids for c in one_by_one]
    for completion in batched:  # the end is banned until min_tokens, always with ignore_eos
        assert completion.finish.stats.completion_tokens == n_tokens
        assert completion.finish.reason == ("length" if n_tokens == 24 else "stop")


def test_a_sequence_with_a_grammar_takes_the_whole_step_one_by_one(
    make_engine: EngineFactory, chain_calls: list[int]
) -> None:
    engine = make_engine(n_parallel=2, ctx_per_slot=256)
    plain = SamplingParams(temperature=0.0, max_tokens=8)
    bound = SamplingParams(temperature=0.0, max_tokens=8, grammar='root ::= "yes" | "no"')
    handles = [
        engine.submit(GenerationRequest("a", "Answer:", plain)),
        engine.submit(GenerationRequest("b", "Answer:", bound)),
    ]
    texts = [handle.collect().text for handle in handles]
    assert texts[1] in ("yes", "no")
    assert chain_calls  # the grammar's sequence (and its batch mates) used the chains


def test_a_lone_greedy_sequence_takes_the_argmax_too(
    make_engine: EngineFactory, sampler_calls: list[int]
) -> None:
    """Even over the demo's 1,024 tokens: the output rows' view is cached, so the argmax
    (~2 µs) costs less than the sampler call (~5 µs) — and it is the same token."""
    engine = make_engine(n_parallel=1, ctx_per_slot=256)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    alone = engine.submit(GenerationRequest("alone", "Hello", params)).collect()
    assert sampler_calls == []
    chained = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
    through_chain = engine.submit(GenerationRequest("alone", "Hello", chained)).collect()
    assert len(sampler_calls) == 8
    assert alone.token_ids == through_chain.token_ids
