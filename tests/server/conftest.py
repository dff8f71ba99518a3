"""One real engine (tiny generated llama model, 4 slots) and one real uvicorn server on
127.0.0.1 for the whole session; tests talk to it with the official ``openai`` SDK and httpx.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from server_helpers import ALICE_KEY, BOB_KEY, MODEL_ID, N_CTX_PER_SLOT, N_SLOTS, make_keys

from homelab.engine.engine import Engine
from homelab.server.config import ServerConfig
from homelab.server.runner import ServerHandle, start_server
from homelab.settings import Settings


@pytest.fixture(scope="session")
def engine(demo_model: Callable[..., Path]) -> Iterator[Engine]:
    settings = Settings(
        n_ctx=N_CTX_PER_SLOT * N_SLOTS, n_ctx_per_slot=N_CTX_PER_SLOT, n_parallel=N_SLOTS
    )
    engine = Engine.load(demo_model("llama"), settings, record_calibration=False)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def server(engine: Engine) -> Iterator[ServerHandle]:
    config = ServerConfig(model_id=MODEL_ID, keys=make_keys(), default_max_tokens=32)
    handle = start_server(engine, config=config)
    yield handle
    handle.stop()


@pytest.fixture
def client(server: ServerHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=server.base_url, api_key=ALICE_KEY, max_retries=0, timeout=60
    ) as sdk:
        yield sdk


@pytest.fixture
def bob(server: ServerHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key=BOB_KEY, max_retries=0, timeout=60) as sdk:
        yield sdk


@pytest.fixture
def http(server: ServerHandle) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as plain:
        yield plain
