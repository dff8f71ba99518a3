"""A sampled request whose chain cuts to its top k first runs that chain on the few hundred
tokens that can survive the cut (``homelab.engine.sampling.top_candidates``), not on the
whole vocabulary: the same top k in the same order, so the same pick from the same random
stream, in a quarter of the time at 152K tokens. Checked against llama.cpp's own sampler
over the whole vocabulary, on random rows and through a real engine on the 32,000-token
bench demo model (below the engine's own threshold, lowered for the test)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import tiny_settings

from homelab.engine import sampling
from homelab.engine.api import GenerationRequest, SamplingParams
from homelab.engine.engine import Engine
from homelab.engine.sampling import top_candidates
from homelab.llamacpp import sampler
from homelab.llamacpp.sampler import SamplerChain


def chain(seed: int, n_vocab: int, top_k: int, biases: dict[int, float]) -> SamplerChain:
    """The engine's order: bias -> top-k -> top-p -> min-p -> temperature -> pick."""
    made = SamplerChain()
    if biases:
        made.add_logit_bias(n_vocab, biases)
    made.add_top_k(top_k)
    made.add_top_p(0.95)
    made.add_min_p(0.05)
    made.add_temperature(0.8)
    made.add_random_pick(seed)
    return made


def rows(n_vocab: int, count: int, seed: int) -> Iterator[np.ndarray]:
    """Logits rows: a normal bulk, and in every other row a few tokens far above it."""
    rng = np.random.default_rng(seed)
    for index in range(count):
        row = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
        if index % 2:
            row[rng.integers(0, n_vocab, 20)] += rng.uniform(5, 20, 20).astype(np.float32)
        yield row


@pytest.mark.parametrize("n_vocab", [8192, 32000, 152064])
@pytest.mark.parametrize(
    ("top_k", "biases"),
    [(40, {}), (1, {}), (200, {}), (40, {2: -math.inf, 7: -math.inf}), (40, {11: -5.0})],
)
def test_the_candidates_give_the_pick_of_the_whole_vocabulary(
    n_vocab: int, top_k: int, biases: dict[int, float]
) -> None:
    whole, few = chain(1234, n_vocab, top_k, biases), chain(1234, n_vocab, top_k, biases)
    every_id = np.arange(n_vocab)
    misjudged = 0
    try:
        for row in rows(n_vocab, 60, seed=n_vocab + top_k):
            if biases:  # a banned token among the largest: the cut must reach past it
                row[list(biases)] = row.max() + 1.0
            ids = top_candidates(row, top_k + len(biases))
            if ids is None:  # the engine then runs the chain over the whole row
                misjudged += 1
                ids = every_id
            else:
                assert len(ids) < n_vocab // 4
            assert whole.pick(every_id, row) == few.pick(ids, row[ids])
    finally:
        whole.close()
        few.close()
    assert misjudged <= 3


def test_the_candidates_hold_the_largest_logits_in_id_order() -> None:
    for row in rows(32000, 40, seed=5):
        ids = top_candidates(row, 50)
        assert ids is not None
        assert set(np.argsort(row)[-50:].tolist()) <= set(ids.tolist())
        assert (np.diff(ids) > 0).all()


def test_a_row_the_sample_misjudges_gives_no_candidates() -> None:
    """The few high logits all where the threshold is read, the rest low: fewer than 40
    reach the threshold; the caller then runs the chain over the whole row."""
    stride = sampling.SAMPLE_STRIDE
    row = np.zeros(32000, dtype=np.float32)
    row[: 16 * stride : stride] = 10.0  # more than the threshold's rank, fewer than 40
    assert top_candidates(row, 40) is None


@pytest.fixture
def bench_engine(demo_model: Callable[..., Path]) -> Iterator[Engine]:
    engine = Engine.load(
        demo_model("llama", "bench", "Q8_0"), tiny_settings(2, 256), record_calibration=False
    )
    yield engine
    engine.close()


def test_an_engine_samples_the_same_tokens_either_way(
    bench_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    picks: list[int] = []
    pick = sampler.SamplerChain.pick

    def counted(self: SamplerChain, ids: np.ndarray, logits: np.ndarray) -> int:
        picks.append(len(ids))
        return pick(self, ids, logits)

    monkeypatch.setattr(sampler.SamplerChain, "pick", counted)
    monkeypatch.setattr(sampling, "TOP_K_FIRST_MIN_VOCAB", 8192)  # the 32K model takes it
    params = SamplingParams(
        temperature=0.9, top_k=40, seed=77, max_tokens=24, ignore_eos=True, logit_bias={13: -4.0}
    )

    def tokens() -> tuple[int, ...]:
        request = GenerationRequest("t", "the cache of the layer", params)
        return bench_engine.submit(request).collect().token_ids

    few = tokens()
    assert len(picks) == 24 and max(picks) < 2000  # each token picked among a few candidates
    monkeypatch.setattr(sampling, "TOP_K_FIRST_MIN_VOCAB", bench_engine.n_vocab + 1)
    assert tokens() == few  # the C chain over the whole vocabulary, the same seed
    assert len(picks) == 24
