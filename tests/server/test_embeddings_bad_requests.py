"""Hostile and malformed ``/v1/embeddings`` requests: each gets a clear 400 in OpenAI's error
envelope and the server keeps serving.

The fast tier runs every case in-process over a fake engine with a fake embedder (no model:
the cases are about the wire format and the limits, see fake_engine.py); the cases marked
``live`` also run against a real server of the BERT demo model, so the fake cannot drift."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fake_engine import FIRST_BYTE_ID, FakeEngine
from fastapi import FastAPI
from server_helpers import ALICE_KEY, MODEL_ID, alice_headers, make_keys

from homelab.engine.embeddings import EmbeddingModelEngine
from homelab.engine.prompt_bound import tokenize_within
from homelab.gguf.reader import read_model
from homelab.server.app import create_app
from homelab.server.config import ServerConfig
from homelab.server.runner import ServerHandle, start_server
from homelab.settings import Settings

PATH = "/v1/embeddings"
FAKE_WIDTH = 8
FAKE_LONGEST = 64
N_VOCAB = 1024


class FakeEmbedder:
    """Byte tokens after a BOS; vectors derived from the tokens (deterministic, unit length)."""

    n_embd = FAKE_WIDTH
    max_input_tokens = FAKE_LONGEST
    pooling = "mean"
    n_vocab = N_VOCAB

    def __init__(self) -> None:
        self.embedded: list[Sequence[Sequence[int]]] = []

    def tokenize(self, text: str) -> list[int]:
        return tokenize_within(
            lambda piece, bos: [1] * bos + [FIRST_BYTE_ID + b for b in piece.encode()],
            text,
            self.max_input_tokens,
        )

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        self.embedded.append(inputs)
        vectors = []
        for tokens in inputs:
            vector = np.arange(1, FAKE_WIDTH + 1, dtype=np.float32) * (sum(tokens) % 7 + 1)
            vectors.append(vector / np.linalg.norm(vector))
        return vectors


@dataclass(frozen=True)
class Case:
    name: str
    param: str | None
    code: str
    body: Any = None
    status: int = 400
    live: bool = False


def emb(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "input": "hello", **fields}


CASES = [
    Case("missing input", "input", "missing_required_parameter", {"model": MODEL_ID}, live=True),
    Case("empty string", "input", "invalid_value", emb(input="")),
    Case("empty list", "input", "invalid_value", emb(input=[]), live=True),
    Case("a million inputs", None, "body_too_complex", emb(input=["a"] * 10**6), live=True),
    Case("2049 inputs", "input", "invalid_value", emb(input=["a"] * 2049)),
    Case("non-string items", "input", "invalid_value", emb(input=[{"text": "a"}]), live=True),
    Case("mixed items", "input", "invalid_value", emb(input=["a", 5])),
    Case("null item", "input", "invalid_value", emb(input=["a", None])),
    Case("empty string item", "input", "invalid_value", emb(input=["a", ""])),
    Case("empty token list", "input", "invalid_value", emb(input=[[1, 2], []])),
    Case("nested too deep", "input", "invalid_value", emb(input=[[[1]]])),
    Case("input is a number", "input", "invalid_value", emb(input=42)),
    Case("booleans are not tokens", "input", "invalid_value", emb(input=[True, False])),
    Case("token outside vocab", "input[0]", "invalid_value", emb(input=[1, 10**6]), live=True),
    Case("negative token", "input[1]", "invalid_value", emb(input=[[1], [-3]])),
    Case(
        "too many tokens",
        "input[0]",
        "context_length_exceeded",
        emb(input=list(range(1, 600))),
        live=True,
    ),
    Case(
        "text too long",
        "input[1]",
        "context_length_exceeded",
        emb(input=["ok", "word " * 5000]),
        live=True,
    ),
    Case("dimensions mismatch", "dimensions", "invalid_value", emb(dimensions=3), live=True),
    Case("dimensions zero", "dimensions", "invalid_value", emb(dimensions=0)),
    Case("dimensions as string", "dimensions", "invalid_value", emb(dimensions="8")),
    Case("unknown encoding", "encoding_format", "invalid_value", emb(encoding_format="int8")),
    Case("wrong model", "model", "model_not_found", emb(model="text-embedding-3"), status=404),
]
LIVE_CASES = [case for case in CASES if case.live]


@pytest.fixture(scope="module")
def fake_embedder() -> FakeEmbedder:
    return FakeEmbedder()


@pytest.fixture(scope="module")
def fast_app(demo_model: Callable[..., Path], fake_embedder: FakeEmbedder) -> FastAPI:
    engine = FakeEngine(read_model(demo_model("llama")), 512)
    engine.embedder = fake_embedder  # type: ignore[attr-defined]
    return create_app(lambda: engine, ServerConfig(model_id=MODEL_ID, keys=make_keys()))


def compact(body: Any) -> bytes:
    """Compact JSON: a million one-letter inputs stay under the 4 MiB body cap (a 400, not 413)."""
    return json.dumps(body, separators=(",", ":")).encode()


async def post(app: FastAPI, body: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return await client.post(PATH, content=compact(body), headers=alice_headers())


def assert_error(case: Case, response: httpx.Response) -> None:
    assert response.status_code == case.status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"]) == (case.param, case.code), error
    assert error["message"] and ALICE_KEY not in error["message"]
    assert len(error["message"]) < 500  # a sentence, not an echo of the input


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_bad_embedding_request_gets_a_clear_error(
    case: Case, fast_app: FastAPI, fake_embedder: FakeEmbedder
) -> None:
    before = len(fake_embedder.embedded)
    assert_error(case, await post(fast_app, case.body))
    assert len(fake_embedder.embedded) == before  # refused before any compute
    ok = await post(fast_app, emb(input=["still", "serving"]))
    assert ok.status_code == 200 and len(ok.json()["data"]) == 2


async def test_the_fast_tier_answers_like_the_real_route(fast_app: FastAPI) -> None:
    reply = (await post(fast_app, emb(input=["a", "bb"], encoding_format="base64"))).json()
    assert reply["object"] == "list" and [d["index"] for d in reply["data"]] == [0, 1]
    assert all(isinstance(d["embedding"], str) for d in reply["data"])
    assert reply["usage"] == {"prompt_tokens": 5, "total_tokens": 5}  # BOS + bytes


@pytest.fixture(scope="module")
def live(demo_model: Callable[..., Path]) -> Iterator[httpx.Client]:
    path = demo_model("bert")
    engine = EmbeddingModelEngine.load(path, Settings(n_threads=1), read_model(path))
    handle: ServerHandle = start_server(
        engine, config=ServerConfig(model_id=MODEL_ID, keys=make_keys())
    )
    with httpx.Client(base_url=handle.url, timeout=60) as client:
        yield client
    handle.stop()
    engine.close()


@pytest.mark.parametrize("case", LIVE_CASES, ids=[c.name for c in LIVE_CASES])
def test_bad_embedding_request_live(case: Case, live: httpx.Client) -> None:
    response = live.post(PATH, content=compact(case.body), headers=alice_headers())
    assert_error(case, response)
    ok = live.post(PATH, json=emb(input=["still serving"]), headers=alice_headers())
    assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 256
