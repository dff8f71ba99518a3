"""``tool_choice`` forces a call in each major family's own syntax: the tiny generated model
(random weights) serves with that family's real chat template, and the call comes back as
``tool_calls`` / ``tool_use`` through the unmodified ``openai`` and ``anthropic`` SDKs,
streamed and not. One model is loaded; the families swap its template."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from server_helpers import ALICE_KEY, MODEL_ID, make_keys
from tool_format_cases import template

from homelab.engine.chat_template import ChatTemplate
from homelab.engine.engine import Engine
from homelab.server.config import ServerConfig
from homelab.server.runner import ServerHandle, start_server
from homelab.server.tools import detect_tool_format
from homelab.settings import Settings

FAMILIES = {
    "Qwen3-Coder": "qwen3-coder",
    "unsloth-mistral-Devstral-Small-2507": "mistral",
    "GLM-4.6": "glm",
    "deepseek-ai-DeepSeek-V3.2": "deepseek-v3.2",
    "moonshotai-Kimi-K2": "kimi-k2",
    "meta-llama-Llama-3.2-3B-Instruct": "llama3",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "hermes",
}
PARAMETERS = {
    "type": "object",
    "properties": {  # enums: few tokens for the random model to write (sampling is the cost)
        "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer", "enum": [1, 2, 3]},
    },
    "required": ["unit", "days"],
}
WEATHER = {"name": "get_weather", "description": "weather", "parameters": PARAMETERS}
ASK = [{"role": "user", "content": "weather?"}]


class TemplateSwap:
    """The engine with a chat template the test chooses (everything else is the engine's)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.template: ChatTemplate | None = engine.chat_template

    @property
    def chat_template(self) -> ChatTemplate | None:
        return self.template

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


@pytest.fixture(scope="module")
def swap(demo_model: Callable[..., Path]) -> Iterator[TemplateSwap]:
    """Room for the longest family prompt (tool instructions run to 4,000 tokens)."""
    settings = Settings(n_ctx=6144, n_ctx_per_slot=6144, n_parallel=1)
    with Engine.load(demo_model("llama"), settings, record_calibration=False) as engine:
        yield TemplateSwap(engine)


@pytest.fixture(scope="module")
def family_server(swap: TemplateSwap) -> Iterator[ServerHandle]:
    config = ServerConfig(model_id=MODEL_ID, keys=make_keys(), default_max_tokens=32)
    handle = start_server(swap, config=config)  # type: ignore[arg-type]
    yield handle
    handle.stop()


@pytest.fixture(params=list(FAMILIES), ids=list(FAMILIES.values()))
def family(request: pytest.FixtureRequest, swap: TemplateSwap) -> Iterator[str]:
    name = request.param
    chat = template(name)
    assert detect_tool_format(chat.source).name == FAMILIES[name]
    swap.template = ChatTemplate(chat.source, "<s>", "</s>")
    yield name
    swap.template = swap._engine.chat_template


def _check(name: str | None, arguments: str) -> None:
    assert name == "get_weather"
    parsed = json.loads(arguments)
    assert parsed["unit"] in ("c", "f") and isinstance(parsed["days"], int)


def test_openai_sdk_forced_call(family: str, family_server: ServerHandle) -> None:
    with openai.OpenAI(base_url=family_server.base_url, api_key=ALICE_KEY, max_retries=0) as sdk:
        tools = [{"type": "function", "function": WEATHER}]
        choice = {"type": "function", "function": {"name": "get_weather"}}
        reply = sdk.chat.completions.create(
            model=MODEL_ID, messages=ASK, tools=tools, tool_choice=choice, max_tokens=400
        )  # type: ignore[arg-type]
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls", message.content
        _check(message.tool_calls[0].function.name, message.tool_calls[0].function.arguments)  # type: ignore[index,union-attr]
        stream = sdk.chat.completions.create(
            model=MODEL_ID, messages=ASK, tools=tools, tool_choice="required", max_tokens=400,
            stream=True,
        )  # type: ignore[arg-type]  # fmt: skip
        deltas = [d for c in stream if c.choices for d in c.choices[0].delta.tool_calls or []]
        _check(deltas[0].function.name, "".join(d.function.arguments or "" for d in deltas))  # type: ignore[union-attr]


def test_anthropic_sdk_forced_call(family: str, family_server: ServerHandle) -> None:
    with anthropic.Anthropic(base_url=family_server.url, api_key=ALICE_KEY, max_retries=0) as sdk:
        tool = {"name": "get_weather", "description": "weather", "input_schema": PARAMETERS}
        reply = sdk.messages.create(
            model=MODEL_ID, messages=ASK, tools=[tool], tool_choice={"type": "any"},
            max_tokens=400,
        )  # type: ignore[arg-type,list-item]  # fmt: skip
        uses = [b for b in reply.content if b.type == "tool_use"]
        assert reply.stop_reason == "tool_use"
        _check(uses[0].name, json.dumps(uses[0].input))
        with sdk.messages.stream(
            model=MODEL_ID, messages=ASK, tools=[tool],
            tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=400,
        ) as stream:  # type: ignore[arg-type,list-item]  # fmt: skip
            final = stream.get_final_message()
        uses = [b for b in final.content if b.type == "tool_use"]
        _check(uses[0].name, json.dumps(uses[0].input))


# One template per remaining format: a forced call, not streamed, through the openai SDK.
OTHER_FORMATS = {
    "Apertus-8B-Instruct": "apertus",
    "Apriel-1.6-15b-Thinker-fixed": "apriel",
    "ByteDance-Seed-OSS": "seed-oss",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "command-r",
    "GigaChat3.1-10B-A1.8B": "gigachat",
    "LFM2.5-8B-A1B": "lfm2",
    "google-gemma-4-31B-it": "gemma4",
    "deepseek-ai-DeepSeek-V4": "deepseek-v4",
    "ibm-granite-granite-3.3-2B-Instruct": "granite",
    "meetkai-functionary-medium-v3.1": "functionary-v3.1",
    "openai-gpt-oss-120b": "gpt-oss",
    "openbmb-MiniCPM5-1B": "minicpm",
    "tencent-Hy3": "hunyuan",
    "upstage-Solar-Open-100B": "solar",
}


# Not forced here: MiniMax-M2's and Nemotron Nano v2's prompts open a think block (whatever
# enable_thinking says), a forced call comes after the thinking (see after_thought), and a
# random-weight model never ends its thinking.


@pytest.mark.parametrize("name", list(OTHER_FORMATS), ids=list(OTHER_FORMATS.values()))
def test_every_other_format_forces_a_call_it_parses(
    name: str, swap: TemplateSwap, family_server: ServerHandle
) -> None:
    chat = template(name)
    assert detect_tool_format(chat.source).name == OTHER_FORMATS[name]
    swap.template = ChatTemplate(chat.source, "<s>", "</s>")
    with openai.OpenAI(base_url=family_server.base_url, api_key=ALICE_KEY, max_retries=0) as sdk:
        tools = [{"type": "function", "function": WEATHER}]
        reply = sdk.chat.completions.create(
            model=MODEL_ID, messages=ASK, tools=tools, tool_choice="required", max_tokens=400,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )  # type: ignore[arg-type]  # fmt: skip
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls", message.content
    _check(message.tool_calls[0].function.name, message.tool_calls[0].function.arguments)  # type: ignore[index,union-attr]
