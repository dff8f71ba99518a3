"""Tool calling end to end: tools rendered by the model's template, a forced call generated
under a grammar, and parsed into ``message.tool_calls`` (streamed as deltas)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
from server_helpers import ALICE_KEY, MODEL_ID, make_keys

from homelab.engine.engine import Engine
from homelab.gguf import vocab
from homelab.server.config import ServerConfig
from homelab.server.runner import start_server
from homelab.settings import Settings

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]}},
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
ASK = [{"role": "user", "content": "what is the weather in Oslo?"}]


def test_required_tool_choice_returns_a_parsed_call(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL_ID,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=128,
        temperature=0,
    )  # type: ignore[list-item]
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]  # type: ignore[index]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments)["city"] in ("Oslo", "Paris")  # type: ignore[union-attr]


def test_named_tool_choice_picks_that_tool(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL_ID,
        messages=ASK,
        tools=[WEATHER, CLOCK],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=128,
        temperature=0,
    )
    assert [c.function.name for c in response.choices[0].message.tool_calls or []] == ["get_time"]  # type: ignore[union-attr]


def test_tool_calls_stream_as_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL_ID,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=128,
        stream=True,
    )  # type: ignore[list-item]
    chunks = [c for c in stream if c.choices]
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    assert {d.index for d in deltas} == {0} and len(deltas) > 1  # the arguments, in fragments
    assert deltas[0].id and deltas[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert not any(d.id or d.function.name for d in deltas[1:])  # type: ignore[union-attr]
    arguments = "".join(d.function.arguments or "" for d in deltas)  # type: ignore[union-attr]
    assert "city" in json.loads(arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "<tool_call>" not in "".join(c.choices[0].delta.content or "" for c in chunks)


def test_tool_choice_none_and_an_agent_loop_history(client: openai.OpenAI) -> None:
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 3}'},
    ]
    response = client.chat.completions.create(
        model=MODEL_ID,
        messages=history,
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=6,  # type: ignore[arg-type,list-item]
    )
    assert response.choices[0].message.tool_calls is None
    assert response.choices[0].finish_reason in ("stop", "length")


def template_without_tools(length: int) -> str:
    plain = (
        "{% for message in messages %}"
        "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return plain + "{#" + "-" * (length - len(plain) - 4) + "#}"


@pytest.fixture
def no_tools_model(demo_model: Callable[..., Path], tmp_path: Path) -> Path:
    """The tiny demo model with a chat template that has no tool support (patched in place:
    same length, so the file layout does not move)."""
    path = tmp_path / "no-tools.gguf"
    shutil.copyfile(demo_model("llama"), path)
    data = path.read_bytes()
    old = vocab.CHAT_TEMPLATE.encode()
    new = template_without_tools(len(old)).encode()
    assert data.count(old) == 1 and len(new) == len(old)
    path.write_bytes(data.replace(old, new))
    return path


@pytest.fixture
def no_tools_client(no_tools_model: Path) -> Iterator[openai.OpenAI]:
    settings = Settings(n_ctx=512, n_ctx_per_slot=512, n_parallel=1, n_threads=1)
    with Engine.load(no_tools_model, settings, record_calibration=False) as engine:
        assert engine.chat_template is not None and not engine.chat_template.supports_tools
        handle = start_server(engine, config=ServerConfig(model_id=MODEL_ID, keys=make_keys()))
        try:
            with openai.OpenAI(base_url=handle.base_url, api_key=ALICE_KEY, max_retries=0) as sdk:
                yield sdk
        finally:
            handle.stop()


def test_template_without_tool_support_rejects_tools(no_tools_client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        no_tools_client.chat.completions.create(
            model=MODEL_ID, messages=ASK, tools=[WEATHER], max_tokens=4
        )  # type: ignore[list-item]
    assert refused.value.body["param"] == "tools"  # type: ignore[index]
    plain = no_tools_client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=4)
    assert plain.choices[0].message.content is not None
