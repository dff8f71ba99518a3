"""Embeddings on real llama.cpp: the BERT demo model with its own pooling, a causal model with
mean pooling beside a generating engine, batching, limits, lifetime, and the planner's
bytes for the context against what llama.cpp allocated."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine_helpers import EngineFactory

from homelab.engine.api import GenerationRequest, SamplingParams, TokenEvent
from homelab.engine.embeddings import (
    Embedder,
    EmbeddingModelEngine,
    EmbeddingOptions,
    is_embedding_model,
)
from homelab.errors import BusyError, ContextLengthError, EngineError
from homelab.gguf.reader import read_model
from homelab.planner.embeddings import embedding_memory
from homelab.settings import Settings

TEXTS = ["the cache layer", "hello world", "a slot for every token", "the cache layer"]
KIB = 1024


@pytest.fixture(scope="module")
def bert_path(demo_model: Callable[..., Path]) -> Path:
    return demo_model("bert")


@pytest.fixture
def bert(bert_path: Path) -> Iterator[Embedder]:
    with Embedder.load(bert_path, EmbeddingOptions(n_seq=4, n_threads=1)) as embedder:
        yield embedder


def one_by_one(embedder: Embedder, texts: list[str]) -> list[np.ndarray]:
    return [embedder.embed([embedder.tokenize(text)])[0] for text in texts]


def test_bert_pools_as_its_metadata_says_and_vectors_are_unit_length(bert: Embedder) -> None:
    assert bert.pooling == "mean"  # bert.pooling_type in the GGUF
    assert bert.n_embd == 256 and bert.max_input_tokens == 512  # its 512 learned positions
    tokens = bert.tokenize("hello world")
    assert tokens[0] != tokens[-1] and len(tokens) >= 4  # [CLS] ... [SEP]
    vectors = bert.embed([tokens])
    assert np.linalg.norm(vectors[0]) == pytest.approx(1.0, abs=1e-5)


def test_batched_vectors_equal_vectors_computed_alone(bert: Embedder) -> None:
    batched = bert.embed([bert.tokenize(text) for text in TEXTS])
    alone = one_by_one(bert, TEXTS)
    for got, want in zip(batched, alone, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)  # f16 sums in another order
    np.testing.assert_allclose(batched[0], batched[3], atol=1e-5)  # same text, same vector
    assert float(batched[0] @ batched[1]) < 0.99  # different texts differ


def test_inputs_are_packed_into_bounded_decodes(bert_path: Path) -> None:
    decodes: list[int] = []
    worker = concurrent.futures.ThreadPoolExecutor(1)

    def counting(function: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        decodes.append(1)
        return worker.submit(function)

    options = EmbeddingOptions(n_seq=4, max_input_tokens=64)
    embedder = Embedder.load(bert_path, options, run=counting)
    try:
        texts = [f"text number {i} about the cache" for i in range(10)]
        vectors = embedder.embed([embedder.tokenize(t) for t in texts])
        assert len(vectors) == 10 and len(decodes) == 3  # 4 + 4 + 2 sequences
        long_ones = [embedder.tokenize("word " * 20)] * 4  # ~22 tokens each: 2 fit in 64
        decodes.clear()
        embedder.embed(long_ones)
        assert len(decodes) == 2
    finally:
        embedder.close()
        worker.shutdown()


def test_limits_are_checked_before_compute(bert: Embedder) -> None:
    with pytest.raises(ContextLengthError):
        bert.tokenize("word " * 2000)  # more than 512 tokens
    with pytest.raises(EngineError, match="outside the vocabulary"):
        bert.embed([[2, 10**6, 3]])
    with pytest.raises(EngineError, match="no tokens"):
        bert.embed([[]])
    with pytest.raises(EngineError, match="no inputs"):
        bert.embed([])


def test_a_cut_keeps_the_head_and_the_closing_token(bert: Embedder) -> None:
    """Ollama's truncate: the first tokens, then BERT's [SEP] still last; a short text whole."""
    limit = bert.max_input_tokens
    long_text = " ".join(f"word{i}" for i in range(4 * limit))
    whole = bert.vocab.tokenize(long_text, add_bos=True, parse_special=False)
    cut, was_cut = bert.tokenize_cut(long_text)
    assert was_cut and len(cut) == limit and cut[: limit - 1] == whole[: limit - 1]
    assert cut[-1] == whole[-1]  # the closing [SEP]
    assert bert.tokenize_cut("hello") == (bert.tokenize("hello"), False)


def test_too_many_waiting_requests_are_refused(bert_path: Path) -> None:
    release = threading.Event()
    worker = concurrent.futures.ThreadPoolExecutor(1)

    def held(function: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        return worker.submit(lambda: (release.wait(10), function())[1])

    embedder = Embedder.load(bert_path, EmbeddingOptions(max_waiting=1), run=held)
    try:
        tokens = [embedder.tokenize("hello")]
        first = concurrent.futures.ThreadPoolExecutor(1).submit(embedder.embed, tokens)
        while embedder._waiting == 0:
            threading.Event().wait(0.01)
        with pytest.raises(BusyError):
            embedder.embed(tokens)
        release.set()
        assert len(first.result(10)) == 1
    finally:
        release.set()
        embedder.close()
        worker.shutdown()


def test_mean_pooling_beside_an_engine_does_not_disturb_generation(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(n_parallel=2)
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)

    def generate() -> list[int]:
        handle = engine.submit(GenerationRequest(tenant="a", prompt="the cache", sampling=greedy))
        return [event.token_id for event in handle if isinstance(event, TokenEvent)]

    before = generate()
    embedder = Embedder.beside(engine, EmbeddingOptions(pooling="mean", n_seq=4))
    assert engine.embedder is embedder and embedder.pooling == "mean"
    texts = [f"an input about slot {i}" for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        embedding = pool.submit(lambda: [embedder.embed([embedder.tokenize(t) for t in texts])])
        during = generate()
        vectors = embedding.result(60)[0]
    assert during == before  # the same greedy tokens while embeddings ran between its steps
    assert len(vectors) == 12
    np.testing.assert_allclose(vectors[0], one_by_one(embedder, texts[:1])[0], atol=1e-4)
    assert generate() == before
    engine.close()  # frees the embedder's context before the model it lives on
    with pytest.raises(EngineError, match="closed"):
        embedder.embed([embedder.tokenize("hello")])


def test_an_embedder_closed_before_its_engine(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=1)
    embedder = Embedder.beside(engine, EmbeddingOptions(pooling="last"))
    assert len(embedder.embed([embedder.tokenize("hello")])) == 1
    embedder.close()  # freed between two engine steps
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    events = list(engine.submit(GenerationRequest(tenant="a", prompt="hi", sampling=greedy)))
    assert sum(isinstance(e, TokenEvent) for e in events) == 4
    engine.close()  # closes the embedder again: a no-op


def test_a_causal_model_needs_a_pooling_named(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=1)
    with pytest.raises(EngineError, match="pools with 'none'"):
        Embedder.beside(engine, EmbeddingOptions())
    assert engine.embedder is None
    with pytest.raises(EngineError, match="unknown pooling"):
        Embedder.beside(engine, EmbeddingOptions(pooling="max"))


def test_embedding_model_engine_serves_embeddings_only(bert_path: Path) -> None:
    info = read_model(bert_path)
    assert is_embedding_model(info)
    engine = EmbeddingModelEngine.load(bert_path, Settings(n_threads=1), info)
    try:
        assert engine.embedder is not None and not engine.chat_template.supports_tools
        with pytest.raises(EngineError, match="embedding model"):
            engine.render_chat([{"role": "user", "content": "hi"}])
        assert engine.load_report.buffers.compute  # llama.cpp's buffer lines were read
        with pytest.raises(EngineError, match="embedding model"):
            engine.submit(GenerationRequest(tenant="a", prompt=(1, 2)))
        assert engine.metrics().n_slots == 1
    finally:
        engine.close()


def test_generative_models_are_not_embedding_models(demo_model: Callable[..., Path]) -> None:
    assert not is_embedding_model(read_model(demo_model("llama")))


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_planner_bytes_match_what_llama_cpp_allocates(
    arch: str, demo_model: Callable[..., Path], make_engine: EngineFactory
) -> None:
    options = EmbeddingOptions(pooling=None if arch == "bert" else "mean", n_seq=4)
    info = read_model(demo_model(arch))
    if arch == "bert":
        embedder = Embedder.load(demo_model(arch), options)
    else:
        embedder = Embedder.beside(make_engine(n_parallel=1), options)
    try:
        predicted = embedding_memory(info, options.max_input_tokens, options.n_seq)
        actual = embedder.buffers
        assert predicted.n_tokens == embedder.max_input_tokens
        assert predicted.kv_bytes == sum(actual.kv.values())  # exact; none for BERT
        assert predicted.compute_bytes == pytest.approx(sum(actual.compute.values()), rel=0.1)
        # the log prints MiB with two decimals: 10 KiB of rounding
        assert abs(predicted.output_bytes - sum(actual.output.values())) <= 16 * KIB
    finally:
        if arch == "bert":
            embedder.close()
