"""The official ``ollama`` client on the features that need their own model: tool calls and
thinking (the generated ``demo:reasoning``, a Qwen3-style template; its random weights write
what a grammar the test sets spells, as in test_reasoning_server.py), images (the generated
vision pair: text model + projector), embeddings (the tiny llama with mean pooling), and a
tenant's second turn reusing its prefix (prompt_eval_count falls, the time to the first token
with it)."""

from __future__ import annotations

import base64
import io
import json
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import ollama
import pytest
from PIL import Image
from server_helpers import ALICE_KEY, BOB_KEY, make_keys

from homelab.engine.api import GenerationRequest
from homelab.engine.embeddings import Embedder, EmbeddingOptions
from homelab.engine.engine import Engine
from homelab.gguf import demo_vision
from homelab.server.config import ServerConfig
from homelab.server.runner import ServerHandle, start_server
from homelab.settings import Settings

THOUGHT, ANSWER = "The cache holds tokens.", "Yes, the cache."
THINK_THEN_ANSWER = f'root ::= "{THOUGHT}" "</think>" "\\n\\n{ANSWER}"'
CALL = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
THINK_THEN_CALL = (
    f'root ::= "{THOUGHT}" "</think>" "\\n\\n<tool_call>\\n" '
    + json.dumps(CALL)
    + ' "\\n</tool_call>"'
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "is the cache warm in Oslo?"}]


def client(handle: ServerHandle, key: str = ALICE_KEY) -> ollama.Client:
    return ollama.Client(host=handle.url, headers={"Authorization": f"Bearer {key}"})


class ForcedEngine:
    """The real engine; requests sample under ``grammar`` when one is set (the test's lever)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.grammar: str | None = None
        self.prompts: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def submit(self, request: GenerationRequest) -> Any:
        self.prompts.append(self._engine.detokenize(list(request.prompt)))
        if self.grammar is not None:
            request = replace(request, sampling=replace(request.sampling, grammar=self.grammar))
        return self._engine.submit(request)


@pytest.fixture(scope="module")
def forced(demo_model: Callable[..., Path]) -> Iterator[ForcedEngine]:
    settings = Settings(n_ctx=2048, n_ctx_per_slot=1024, n_parallel=2, n_threads=1)
    engine = Engine.load(demo_model("reasoning"), settings, record_calibration=False)
    yield ForcedEngine(engine)
    engine.close()


@pytest.fixture(scope="module")
def thinker(forced: ForcedEngine) -> Iterator[ServerHandle]:
    config = ServerConfig(model_id="thinker", keys=make_keys(), default_max_tokens=64)
    handle = start_server(lambda: forced, config=config)  # type: ignore[arg-type,return-value]
    yield handle
    handle.stop()


def forced_chat(thinker: ServerHandle, forced: ForcedEngine, grammar: str, **params: Any) -> Any:
    """A greedy chat under ``grammar`` (a stream read whole: its lines in a list)."""
    forced.grammar = grammar
    try:
        reply = client(thinker).chat(
            model="thinker", messages=ASK, options={"temperature": 0, "num_predict": 256}, **params
        )
        return list(reply) if params.get("stream") else reply
    finally:
        forced.grammar = None


def test_thinking_comes_apart_from_the_content(thinker: ServerHandle, forced: ForcedEngine) -> None:
    reply = forced_chat(thinker, forced, THINK_THEN_ANSWER, think=True)
    assert (reply.message.thinking, reply.message.content) == (THOUGHT, ANSWER)
    parts = forced_chat(thinker, forced, THINK_THEN_ANSWER, think=True, stream=True)
    thinking = "".join(p.message.thinking or "" for p in parts)
    content = "".join(p.message.content or "" for p in parts)
    assert (thinking, content) == (THOUGHT, ANSWER)
    first_content = next(i for i, p in enumerate(parts) if p.message.content)
    assert all(not p.message.content for p in parts[:first_content])  # thinking came first


def test_think_false_switches_the_template(thinker: ServerHandle, forced: ForcedEngine) -> None:
    forced_chat(thinker, forced, 'root ::= "' + ANSWER + '"', think=False)
    assert "<think>\n\n</think>" in forced.prompts[-1]  # Qwen3's switch: an empty thought
    forced_chat(thinker, forced, THINK_THEN_ANSWER, think="high")
    assert forced.prompts[-1].rstrip().endswith("<think>")


def test_a_tool_call_comes_in_ollamas_shape(thinker: ServerHandle, forced: ForcedEngine) -> None:
    reply = forced_chat(thinker, forced, THINK_THEN_CALL, tools=[WEATHER], think=True)
    calls = reply.message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert calls[0].function.arguments == {"city": "Oslo"}  # an object, not JSON text
    assert reply.message.thinking == THOUGHT and reply.done_reason == "stop"
    streamed = forced_chat(thinker, forced, THINK_THEN_CALL, tools=[WEATHER], stream=True)
    called = [c for p in streamed for c in p.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in called] == [
        ("get_weather", {"city": "Oslo"})
    ]


def test_the_tool_result_turn_renders_through_the_template(
    thinker: ServerHandle, forced: ForcedEngine
) -> None:
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
        },
        {"role": "tool", "content": "12 degrees and sunny", "tool_name": "get_weather"},
    ]
    forced.grammar = 'root ::= "' + ANSWER + '"'
    try:
        reply = client(thinker).chat(model="thinker", messages=history, tools=[WEATHER])
    finally:
        forced.grammar = None
    assert reply.done
    prompt = forced.prompts[-1]
    assert '"city": "Oslo"' in prompt and "12 degrees and sunny" in prompt


def test_show_reports_tools_and_thinking(thinker: ServerHandle) -> None:
    shown = client(thinker).show("thinker")
    assert {"completion", "tools", "thinking"} <= set(shown.capabilities or [])
    arch = shown.modelinfo["general.architecture"]  # type: ignore[index]
    assert shown.modelinfo[f"{arch}.context_length"] == 1024  # type: ignore[index]


# --- images ------------------------------------------------------------------------------------


def png(width_px: int, height_px: int) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (height_px, width_px, 3), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def vision() -> Iterator[ServerHandle]:
    kind = demo_vision.VISION_KINDS[0]
    settings = Settings(
        n_ctx=2048,
        n_ctx_per_slot=1024,
        n_parallel=2,
        n_threads=1,
        mmproj_path=str(demo_vision.mmproj_path(kind)),
        mmproj_offload=False,
    )
    engine = Engine.load(demo_vision.text_model_path(kind), settings, record_calibration=False)
    handle = start_server(engine, config=ServerConfig(model_id="vision", keys=make_keys()))
    yield handle
    handle.stop()
    engine.close()


def test_images_are_read_by_the_projector(vision: ServerHandle) -> None:
    olla = client(vision)
    text_only = olla.chat(model="vision", messages=[{"role": "user", "content": "what is it?"}])
    image = png(200, 140)
    seen = olla.chat(
        model="vision",
        messages=[{"role": "user", "content": "what is it?", "images": [image]}],
        options={"num_predict": 2},
    )
    assert (seen.prompt_eval_count or 0) > (text_only.prompt_eval_count or 0) + 16  # its tokens
    generated = olla.generate(
        model="vision", prompt="describe", images=[base64.b64encode(image).decode()]
    )
    assert generated.done and (generated.prompt_eval_count or 0) > 16
    assert "vision" in (olla.show("vision").capabilities or [])


# --- embeddings --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedding(demo_model: Callable[..., Path]) -> Iterator[ServerHandle]:
    settings = Settings(n_ctx=1024, n_ctx_per_slot=512, n_parallel=2, n_threads=1)
    engine = Engine.load(demo_model("llama"), settings, record_calibration=False)
    Embedder.beside(engine, EmbeddingOptions(pooling="mean", max_input_tokens=256))
    handle = start_server(engine, config=ServerConfig(model_id="llama-mean", keys=make_keys()))
    yield handle
    handle.stop()
    engine.close()


def test_embed_and_the_older_embeddings(embedding: ServerHandle) -> None:
    olla = client(embedding)
    vectors = olla.embed(model="llama-mean", input=["the cache layer", "hello world"]).embeddings
    assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 0
    assert abs(float(np.linalg.norm(vectors[0])) - 1.0) < 1e-4
    one = olla.embed(model="llama-mean", input="the cache layer").embeddings[0]
    assert np.allclose(one, vectors[0], atol=1e-5)
    older = olla.embeddings(model="llama-mean", prompt="the cache layer").embedding
    assert np.allclose(older, vectors[0], atol=1e-5)
    assert "embedding" in (olla.show("llama-mean").capabilities or [])


def test_embed_cuts_a_long_input_unless_told_not_to(embedding: ServerHandle) -> None:
    """Ollama's ``truncate`` (true by default): the input's first tokens, as Ollama does; a
    text of a million characters is cut after bounded work."""
    olla = client(embedding)
    words = " ".join(f"word{i}" for i in range(2000))  # far more than the 256 tokens taken
    cut = olla.embed(model="llama-mean", input=words)
    assert cut.prompt_eval_count == 256
    huge = olla.embed(model="llama-mean", input="x" * 1_000_000)
    assert huge.prompt_eval_count == 256
    head = olla.embed(model="llama-mean", input=words[: len(words) // 2])  # also over 256
    assert np.allclose(cut.embeddings[0], head.embeddings[0], atol=1e-5)  # the same head
    with pytest.raises(ollama.ResponseError) as refused:
        olla.embed(model="llama-mean", input=words, truncate=False)
    assert refused.value.status_code == 400 and "at most 256 tokens" in refused.value.error
    older = olla.embeddings(model="llama-mean", prompt=words).embedding  # /api/embeddings too
    assert np.allclose(older, cut.embeddings[0], atol=1e-5)


# --- a tenant's second turn --------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_context(demo_model: Callable[..., Path]) -> Iterator[ServerHandle]:
    settings = Settings(n_ctx=4096, n_ctx_per_slot=2048, n_parallel=2, n_threads=1)
    engine = Engine.load(demo_model("llama"), settings, record_calibration=False)
    handle = start_server(engine, config=ServerConfig(model_id="tiny", keys=make_keys()))
    yield handle
    handle.stop()
    engine.close()


def streamed_ttft_s(olla: ollama.Client, messages: list[dict[str, Any]]) -> tuple[float, Any]:
    """Seconds to the first line that carries text, and the last line."""
    started_s = time.perf_counter()
    first_s, last = None, None
    for part in olla.chat(
        model="tiny", messages=messages, stream=True, options={"num_predict": 4, "temperature": 0}
    ):
        if first_s is None:
            first_s = time.perf_counter() - started_s
        last = part
    assert first_s is not None and last is not None
    return first_s, last


def test_second_turn_reuses_the_tenants_prefix(long_context: ServerHandle) -> None:
    """~1,800 prompt tokens read once; the next turn (the same history and a few more words)
    reads only the new ones — for this tenant, not for another."""
    words = " ".join(f"fact{i} holds cache{i * 7 % 101}" for i in range(110))
    first_turn = [{"role": "system", "content": words}, {"role": "user", "content": "hi"}]
    alice, bob = client(long_context), client(long_context, BOB_KEY)
    cold_s, cold = streamed_ttft_s(alice, first_turn)
    assert cold.prompt_eval_count > 1500
    history = [*first_turn, {"role": "assistant", "content": cold.message.content or "ok"}]
    warm: list[float] = []
    for turn in range(3):
        ask = [*history, {"role": "user", "content": f"and then {turn}?"}]
        warm_s, last = streamed_ttft_s(alice, ask)
        assert last.prompt_eval_count < 40, last.prompt_eval_count  # the new turn only
        warm.append(warm_s)
    other_s, other = streamed_ttft_s(bob, first_turn)  # another tenant reads it all
    assert other.prompt_eval_count == cold.prompt_eval_count
    assert min(cold_s, other_s) >= 5 * statistics.median(warm), (cold_s, other_s, warm)
