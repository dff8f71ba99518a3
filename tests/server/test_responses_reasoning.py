"""Reasoning items in the Responses API, on the real ``demo:reasoning`` model (a Qwen3-style
template that opens ``<think>``) with the official ``openai`` SDK.

The weights are random, so the thought is forced: requests sample under a GBNF grammar the
test sets (the only lever); the template, the splitting, the items, the events and the usage
are the server's own path."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

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
CALL = json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}})
THINK_THEN_CALL = (
    f'root ::= "{THOUGHT}" "</think>" "\\n\\n<tool_call>\\n" {json.dumps(CALL)} "\\n</tool_call>"'
)
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


class ForcedEngine:
    """The real engine; its requests sample under ``grammar`` when one is set."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.grammar: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def submit(self, request: GenerationRequest) -> Any:
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
def sdk(forced: ForcedEngine) -> Iterator[openai.OpenAI]:
    config = ServerConfig(model_id=MODEL_ID, keys=make_keys(), default_max_tokens=64)
    handle: ServerHandle = start_server(lambda: forced, config=config)  # type: ignore[arg-type,return-value]
    with openai.OpenAI(base_url=handle.base_url, api_key=ALICE_KEY, max_retries=0) as client:
        yield client
    handle.stop()


def create(sdk: openai.OpenAI, forced: ForcedEngine, grammar: str, **params: Any) -> Any:
    forced.grammar = grammar
    params = {"max_output_tokens": 160, **params}  # room for the whole forced text
    try:
        return sdk.responses.create(model=MODEL_ID, input="is the cache warm?", **params)
    finally:
        forced.grammar = None


def test_reasoning_comes_first_as_its_own_item(sdk: openai.OpenAI, forced: ForcedEngine) -> None:
    response = create(sdk, forced, THINK_THEN_ANSWER)
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == THOUGHT
    assert message.type == "message" and response.output_text == ANSWER
    assert response.status == "completed"
    details = response.usage.output_tokens_details
    assert 0 < details.reasoning_tokens < response.usage.output_tokens


def test_streamed_reasoning_then_text(sdk: openai.OpenAI, forced: ForcedEngine) -> None:
    events = list(create(sdk, forced, THINK_THEN_ANSWER, stream=True))
    kinds = [e.type for e in events]
    first_text = kinds.index("response.output_text.delta")
    assert kinds.index("response.reasoning_text.delta") < kinds.index(
        "response.reasoning_text.done"
    )
    assert kinds.index("response.reasoning_text.done") < first_text
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    answer = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thought, answer) == (THOUGHT, ANSWER)
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message"]
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    assert added == [0, 1]


def test_a_tool_call_after_reasoning_is_a_function_call_item(
    sdk: openai.OpenAI, forced: ForcedEngine
) -> None:
    response = create(sdk, forced, THINK_THEN_CALL, tools=[WEATHER])
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    call = response.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Oslo"}


def test_reasoning_effort_none_turns_thinking_off(sdk: openai.OpenAI, forced: ForcedEngine) -> None:
    """The template's enable_thinking switch: an empty think block in the prompt, no item."""
    response = create(sdk, forced, f'root ::= "{ANSWER}"', reasoning={"effort": "none"})
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == ANSWER
