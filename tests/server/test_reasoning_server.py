"""A reasoning model served for real: the generated ``demo:reasoning`` (a Qwen3-style template
that opens ``<think>``, with an ``enable_thinking`` switch; ``<think>``/``</think>`` are single
tokens) on llama.cpp, behind uvicorn, asked with the official ``openai`` and ``anthropic``
SDKs.

Its weights are random, so what it "thinks" is forced: the engine is wrapped so every request
it runs samples under a GBNF grammar the test sets (``SamplingParams.grammar``), spelling the
thought, the closing tag and the answer. Everything else — the template, the switches, the
splitting, the streaming, usage — is the server's own path.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from server_helpers import ALICE_KEY, make_keys

from homelab.engine.api import GenerationRequest
from homelab.engine.engine import Engine
from homelab.server.config import ServerConfig
from homelab.server.runner import ServerHandle, start_server
from homelab.settings import Settings

MODEL_ID = "thinker"
THOUGHT, ANSWER = "The cache holds tokens.", "Yes, the cache."
THINK_THEN_ANSWER = f'root ::= "{THOUGHT}" "</think>" "\\n\\n{ANSWER}"'
ANSWER_ONLY = f'root ::= "{ANSWER}"'
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
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
USER = [{"role": "user", "content": "is the cache warm?"}]


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
    settings = Settings(n_ctx=2048, n_ctx_per_slot=1024, n_parallel=2)
    engine = Engine.load(demo_model("reasoning"), settings, record_calibration=False)
    yield ForcedEngine(engine)
    engine.close()


@pytest.fixture(scope="module")
def server(forced: ForcedEngine) -> Iterator[ServerHandle]:
    config = ServerConfig(model_id=MODEL_ID, keys=make_keys(), default_max_tokens=64)
    handle = start_server(lambda: forced, config=config)  # type: ignore[arg-type,return-value]
    yield handle
    handle.stop()


@pytest.fixture
def sdk(server: ServerHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key=ALICE_KEY, max_retries=0) as client:
        yield client


@pytest.fixture
def claude(server: ServerHandle) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.url, api_key=ALICE_KEY, max_retries=0) as client:
        yield client


def ask(sdk: openai.OpenAI, forced: ForcedEngine, grammar: str, **params: Any) -> Any:
    forced.grammar = grammar
    params = {"max_tokens": 64, **params}
    try:
        return sdk.chat.completions.create(model=MODEL_ID, messages=USER, temperature=0, **params)
    finally:
        forced.grammar = None


def test_reasoning_comes_apart_from_the_content(sdk: openai.OpenAI, forced: ForcedEngine) -> None:
    response = ask(sdk, forced, THINK_THEN_ANSWER)
    assert forced.prompts[-1].rstrip().endswith("<think>")  # the template opened the block
    message = response.choices[0].message.model_dump()
    assert (message["reasoning_content"], message["content"]) == (THOUGHT, ANSWER)
    assert response.choices[0].finish_reason == "stop"
    details = response.usage.completion_tokens_details
    assert details is not None and 0 < details.reasoning_tokens < response.usage.completion_tokens


def test_streamed_reasoning_comes_first_then_the_content(
    sdk: openai.OpenAI, forced: ForcedEngine
) -> None:
    forced.grammar = THINK_THEN_ANSWER
    try:
        stream = sdk.chat.completions.create(
            model=MODEL_ID,
            messages=USER,  # type: ignore[arg-type]
            max_tokens=64,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        kinds: list[tuple[str, str]] = []
        usage = None
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                delta = choice.delta.model_dump()
                kinds += [(k, delta[k]) for k in ("reasoning_content", "content") if delta.get(k)]
    finally:
        forced.grammar = None
    assert "".join(t for k, t in kinds if k == "reasoning_content") == THOUGHT
    assert "".join(t for k, t in kinds if k == "content") == ANSWER
    order = [k for k, _ in kinds]
    assert order == sorted(order, key=lambda k: k != "reasoning_content")  # never interleaved
    assert usage is not None and usage.completion_tokens_details.reasoning_tokens > 0


def test_enable_thinking_false_gives_no_reasoning(sdk: openai.OpenAI, forced: ForcedEngine) -> None:
    for knob in (
        {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
        {"reasoning_effort": "none"},
    ):
        response = ask(sdk, forced, ANSWER_ONLY, **knob)
        assert forced.prompts[-1].rstrip().endswith("</think>")  # an empty, closed block
        message = response.choices[0].message.model_dump()
        assert message["content"] == ANSWER, knob
        assert message.get("reasoning_content") is None, knob


def test_reasoning_format_none_leaves_it_in_the_content(
    sdk: openai.OpenAI, forced: ForcedEngine
) -> None:
    response = ask(sdk, forced, THINK_THEN_ANSWER, extra_body={"reasoning_format": "none"})
    message = response.choices[0].message.model_dump()
    assert message["content"] == f"{THOUGHT}</think>\n\n{ANSWER}"
    assert message.get("reasoning_content") is None


def test_a_tool_call_after_the_reasoning_is_parsed(
    sdk: openai.OpenAI, forced: ForcedEngine
) -> None:
    response = ask(sdk, forced, THINK_THEN_CALL, tools=[WEATHER], max_tokens=256)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.model_dump()["reasoning_content"] == THOUGHT
    call = choice.message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Oslo"},
    )


def test_forced_tool_choice_lets_the_model_think_first(sdk: openai.OpenAI) -> None:
    """The server's own grammar for tool_choice "required" starts inside <think>: llama.cpp
    accepts it and samples a thought (random weights: it may not finish in 16 tokens)."""
    response = sdk.chat.completions.create(
        model=MODEL_ID,
        messages=USER,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=16,
        temperature=0,
    )
    message = response.choices[0].message.model_dump()
    assert response.choices[0].finish_reason in ("length", "tool_calls")
    assert message["reasoning_content"] or message["tool_calls"]
    assert "<tool_call>" not in (message["reasoning_content"] or "")  # not forced from token 1
    assert "</think>" not in (message["content"] or "")


def test_no_think_server_default_and_the_request_override(forced: ForcedEngine) -> None:
    config = ServerConfig(model_id=MODEL_ID, enable_thinking=False)
    handle = start_server(lambda: forced, config=config)  # type: ignore[arg-type,return-value]
    try:
        with openai.OpenAI(base_url=handle.base_url, api_key="none", max_retries=0) as local:
            off = ask(local, forced, ANSWER_ONLY)
            assert forced.prompts[-1].rstrip().endswith("</think>")
            on = ask(
                local,
                forced,
                THINK_THEN_ANSWER,
                extra_body={"chat_template_kwargs": {"enable_thinking": True}},
            )
    finally:
        handle.stop()
    assert off.choices[0].message.model_dump().get("reasoning_content") is None
    assert on.choices[0].message.model_dump()["reasoning_content"] == THOUGHT


def test_template_kwargs_are_bounded(server: ServerHandle) -> None:
    headers = {"Authorization": f"Bearer {ALICE_KEY}"}
    for kwargs in ({"messages": []}, {"enable_thinking": "yes"}, {"x": {"nested": 1}}):
        body = {"model": MODEL_ID, "messages": USER, "chat_template_kwargs": kwargs}
        response = httpx.post(server.base_url + "/chat/completions", json=body, headers=headers)
        assert response.status_code == 400, kwargs
        assert response.json()["error"]["param"] == "chat_template_kwargs"


# --- the same model through the Messages API ------------------------------------------------


def test_messages_api_returns_a_thinking_block(
    claude: anthropic.Anthropic, forced: ForcedEngine
) -> None:
    forced.grammar = THINK_THEN_ANSWER
    try:
        message = claude.messages.create(
            model=MODEL_ID,
            max_tokens=64,
            messages=[{"role": "user", "content": "is the cache warm?"}],
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
    finally:
        forced.grammar = None
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == THOUGHT  # type: ignore[union-attr]
    assert message.content[1].text == ANSWER  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"


def test_messages_stream_sends_thinking_deltas_then_text(
    claude: anthropic.Anthropic, forced: ForcedEngine
) -> None:
    forced.grammar = THINK_THEN_ANSWER
    try:
        with claude.messages.stream(
            model=MODEL_ID,
            max_tokens=64,
            messages=[{"role": "user", "content": "is the cache warm?"}],
        ) as stream:
            deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
            final = stream.get_final_message()
    finally:
        forced.grammar = None
    assert deltas[0] == "thinking_delta" and deltas[-1] == "text_delta"
    assert deltas == sorted(deltas, key=lambda kind: kind != "thinking_delta")
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == THOUGHT  # type: ignore[union-attr]
    assert final.content[1].text == ANSWER  # type: ignore[union-attr]


def test_messages_api_thinking_disabled_switches_the_template(
    claude: anthropic.Anthropic, forced: ForcedEngine
) -> None:
    forced.grammar = ANSWER_ONLY
    try:
        message = claude.messages.create(
            model=MODEL_ID,
            max_tokens=64,
            messages=[{"role": "user", "content": "is the cache warm?"}],
            thinking={"type": "disabled"},
        )
    finally:
        forced.grammar = None
    assert forced.prompts[-1].rstrip().endswith("</think>")
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [("text", ANSWER)]


def test_serve_flags_set_the_server_defaults() -> None:
    from homelab.cli import serve

    parser = argparse.ArgumentParser()
    serve.configure(parser)
    plain = serve._config(parser.parse_args(["demo:reasoning"]), Path("m.gguf"), None)
    assert (plain.reasoning_format, plain.enable_thinking) == ("auto", None)
    args = parser.parse_args(["demo:reasoning", "--reasoning-format", "none", "--no-think"])
    chosen = serve._config(args, Path("m.gguf"), None)
    assert (chosen.reasoning_format, chosen.enable_thinking) == ("none", False)
