"""``/v1/embeddings`` with the official ``openai`` SDK, unmodified, against real servers: the
BERT demo model served alone (pooling from its GGUF) and the tiny llama served with mean
pooling beside its generation engine."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from server_helpers import ALICE_KEY, MODEL_ID, alice_headers, make_keys

from homelab.engine.embeddings import Embedder, EmbeddingModelEngine, EmbeddingOptions
from homelab.engine.engine import Engine
from homelab.gguf.reader import read_model
from homelab.server.app import server_state
from homelab.server.config import ServerConfig
from homelab.server.runner import ServerHandle, start_server
from homelab.settings import Settings

BERT_ID = "bert-tiny"
LLAMA_ID = "llama-mean"
TEXTS = ["the cache layer", "hello world", "a slot for every token"]


def sdk(handle: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=handle.base_url, api_key=ALICE_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def bert_server(demo_model: Callable[..., Path]) -> Iterator[ServerHandle]:
    path = demo_model("bert")
    engine = EmbeddingModelEngine.load(path, Settings(n_threads=1), read_model(path))
    handle = start_server(engine, config=ServerConfig(model_id=BERT_ID, keys=make_keys()))
    yield handle
    handle.stop()
    engine.close()


@pytest.fixture(scope="module")
def llama_server(demo_model: Callable[..., Path]) -> Iterator[ServerHandle]:
    settings = Settings(n_ctx=1024, n_ctx_per_slot=512, n_parallel=2, n_threads=1)
    engine = Engine.load(demo_model("llama"), settings, record_calibration=False)
    Embedder.beside(engine, EmbeddingOptions(pooling="mean", max_input_tokens=256))
    handle = start_server(engine, config=ServerConfig(model_id=LLAMA_ID, keys=make_keys()))
    yield handle
    handle.stop()
    engine.close()


@pytest.fixture(params=["bert", "llama"])
def served(
    request: pytest.FixtureRequest, bert_server: ServerHandle, llama_server: ServerHandle
) -> Iterator[tuple[openai.OpenAI, str]]:
    handle, model = (bert_server, BERT_ID) if request.param == "bert" else (llama_server, LLAMA_ID)
    with sdk(handle) as client:
        yield client, model


def vector(values: object) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def test_single_input_float_and_base64_agree(served: tuple[openai.OpenAI, str]) -> None:
    client, model = served
    as_float = client.embeddings.create(model=model, input="hello world", encoding_format="float")
    by_default = client.embeddings.create(model=model, input="hello world")  # base64, decoded
    assert as_float.object == "list" and as_float.model == model
    (item,) = as_float.data
    assert item.object == "embedding" and item.index == 0 and len(item.embedding) == 256
    np.testing.assert_array_equal(vector(item.embedding), vector(by_default.data[0].embedding))
    assert np.linalg.norm(vector(item.embedding)) == pytest.approx(1.0, abs=1e-5)
    usage = as_float.usage
    assert usage.prompt_tokens >= 2 and usage.total_tokens == usage.prompt_tokens


def test_base64_is_little_endian_float32(served: tuple[openai.OpenAI, str]) -> None:
    client, model = served
    raw = client.embeddings.create(model=model, input="hello world", encoding_format="base64")
    import base64

    decoded = np.frombuffer(base64.b64decode(str(raw.data[0].embedding)), dtype="<f4")
    floats = client.embeddings.create(model=model, input="hello world", encoding_format="float")
    np.testing.assert_array_equal(decoded, vector(floats.data[0].embedding))


def test_batch_is_in_order_deterministic_and_equals_single_inputs(
    served: tuple[openai.OpenAI, str],
) -> None:
    client, model = served
    batch = client.embeddings.create(model=model, input=[*TEXTS, TEXTS[0]])
    assert [item.index for item in batch.data] == [0, 1, 2, 3]
    vectors = [vector(item.embedding) for item in batch.data]
    again = [
        vector(item.embedding) for item in client.embeddings.create(model=model, input=TEXTS).data
    ]
    for first, second in zip(vectors, again, strict=False):
        np.testing.assert_allclose(first, second, atol=1e-4)  # batch composition: f16 rounding
    single = vector(client.embeddings.create(model=model, input=TEXTS[1]).data[0].embedding)
    np.testing.assert_allclose(vectors[1], single, atol=1e-4)
    singles = [client.embeddings.create(model=model, input=t).usage.prompt_tokens for t in TEXTS]
    assert batch.usage.prompt_tokens == sum(singles) + singles[0]


def test_cosine_similarity_is_sane(served: tuple[openai.OpenAI, str]) -> None:
    client, model = served
    a, b, c = (
        vector(item.embedding) for item in client.embeddings.create(model=model, input=TEXTS).data
    )
    assert float(a @ a) == pytest.approx(1.0, abs=1e-5)
    for x, y in ((a, b), (a, c), (b, c)):
        assert -1.0 <= float(x @ y) < 0.999  # distinct texts, distinct directions


def test_token_id_inputs_equal_their_text(
    served: tuple[openai.OpenAI, str], bert_server: ServerHandle, llama_server: ServerHandle
) -> None:
    client, model = served
    handle = bert_server if model == BERT_ID else llama_server
    embedder = server_state(handle.app).engine().embedder  # type: ignore[attr-defined]
    ids = embedder.tokenize("hello world")
    by_text = client.embeddings.create(model=model, input="hello world", encoding_format="float")
    by_ids = client.embeddings.create(model=model, input=[ids, ids], encoding_format="float")
    assert by_ids.usage.prompt_tokens == 2 * by_text.usage.prompt_tokens == 2 * len(ids)
    for item in by_ids.data:
        np.testing.assert_allclose(
            vector(item.embedding), vector(by_text.data[0].embedding), atol=1e-4
        )


def test_dimensions_equal_to_the_width_is_accepted(served: tuple[openai.OpenAI, str]) -> None:
    client, model = served
    reply = client.embeddings.create(model=model, input="hi", dimensions=256)
    assert len(reply.data[0].embedding) == 256
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model=model, input="hi", dimensions=64)
    assert raised.value.body["param"] == "dimensions"  # type: ignore[index]


def test_generation_on_an_embedding_model_is_a_clear_400(bert_server: ServerHandle) -> None:
    with sdk(bert_server) as client:
        with pytest.raises(openai.BadRequestError, match="embeddings only"):
            client.chat.completions.create(
                model=BERT_ID, messages=[{"role": "user", "content": "hi"}]
            )
        with pytest.raises(openai.BadRequestError, match="embedding model"):
            client.completions.create(model=BERT_ID, prompt="hi", max_tokens=2)
        assert client.embeddings.create(model=BERT_ID, input="still serving").data


def test_a_model_without_embeddings_says_how_to_get_them(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="--embeddings mean") as raised:
        client.embeddings.create(model=MODEL_ID, input="hi")
    assert raised.value.code == "embeddings_unavailable"


def test_embeddings_are_counted_in_the_metrics(llama_server: ServerHandle) -> None:
    with sdk(llama_server) as client:
        client.embeddings.create(model=LLAMA_ID, input=TEXTS)
    text = httpx.get(llama_server.url + "/metrics", headers=alice_headers()).text
    assert 'route="/v1/embeddings",status="200"' in text
    counted = [line for line in text.splitlines() if line.startswith("homelab_prompt_tokens_total")]
    assert counted and float(counted[0].split()[-1]) > 0
