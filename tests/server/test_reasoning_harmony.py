"""gpt-oss's channels through the whole server, in the fast tier: no gpt-oss model can be
generated here (its tokenizer is tiktoken-style), so a fake engine with a harmony-style
template replays a scripted reply token by token — markers split across tokens, the way a
real vocabulary cuts them. Also: an engine failure after a Messages stream started."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_engine import FakeEngine, FakeHandle
from server_helpers import ALICE_KEY, MODEL_ID, N_CTX_PER_SLOT, make_keys

from homelab.engine.api import FinishEvent, GenerationRequest, TokenEvent
from homelab.engine.chat_template import ChatTemplate
from homelab.gguf.reader import read_model
from homelab.server.app import create_app
from homelab.server.config import ServerConfig

HARMONY = (
    "{% for m in messages %}{% if m.role == 'assistant' %}<|start|>assistant<|channel|>final"
    "<|message|>{{ m.content }}<|end|>{% else %}<|start|>{{ m.role }}<|message|>{{ m.content }}"
    "<|end|>{% endif %}{% endfor %}"
    "{% if tools %}<|start|>developer<|message|>{{ tools | tojson }}<|end|>{% endif %}"
    "<|start|>system<|message|>Reasoning: {{ reasoning_effort or 'medium' }}<|end|>"
    "<|start|>assistant"
)
REPLY = [
    "<|chan", "nel|>analysis<|mes", "sage|>The user ", "asks about the cache.", "<|end|>",
    "<|start|>assistant<|channel|>final<|message|>", "It is ", "warm.",
]  # fmt: skip
CALL = [
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant",
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
    '{"city":',
    ' "Oslo"}',
]
KEY = {"Authorization": f"Bearer {ALICE_KEY}"}
USER = [{"role": "user", "content": "is the cache warm?"}]
WEATHER = {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}


class ScriptedHandle(FakeHandle):
    def __init__(self, request: GenerationRequest, script: list[str], fail: bool) -> None:
        super().__init__(request)
        self.script, self.fail = script, fail

    async def __aiter__(self) -> AsyncIterator[TokenEvent | FinishEvent]:
        for index, text in enumerate(self.script):
            yield TokenEvent(text, 100 + index)
        if self.fail:
            yield FinishEvent("error", self._stats(len(self.script)), error="the GPU fell over")
        else:
            yield FinishEvent("stop", self._stats(len(self.script)))


class ScriptedEngine(FakeEngine):
    def __init__(self, model_info: Any) -> None:
        super().__init__(model_info, N_CTX_PER_SLOT)
        self.chat_template = ChatTemplate(HARMONY)
        self.script: list[str] = REPLY
        self.fail = False

    def submit(self, request: GenerationRequest) -> ScriptedHandle:
        super().submit(request)
        return ScriptedHandle(request, self.script, self.fail)


@pytest.fixture
def scripted(demo_model: Callable[..., Path]) -> ScriptedEngine:
    return ScriptedEngine(read_model(demo_model("llama")))


def post(engine: ScriptedEngine, path: str, body: dict[str, Any]) -> httpx.Response:
    app = create_app(lambda: engine, ServerConfig(model_id=MODEL_ID, keys=make_keys()))

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.post(path, json=body, headers=KEY)

    return asyncio.run(run())


def prompt_of(engine: ScriptedEngine) -> str:
    return bytes(t - 8 for t in engine.submitted[-1].prompt[1:]).decode()


def test_chat_completion_splits_the_channels(scripted: ScriptedEngine) -> None:
    body = {"model": MODEL_ID, "messages": USER, "reasoning_effort": "low", "max_tokens": 64}
    response = post(scripted, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert message["reasoning_content"] == "The user asks about the cache."
    assert message["content"] == "It is warm."
    assert "Reasoning: low" in prompt_of(scripted)  # the template reads reasoning_effort
    details = response.json()["usage"]["completion_tokens_details"]
    assert 0 < details["reasoning_tokens"] < len(REPLY)


def test_streamed_channels(scripted: ScriptedEngine) -> None:
    body = {"model": MODEL_ID, "messages": USER, "stream": True, "max_tokens": 64}
    response = post(scripted, "/v1/chat/completions", body)
    chunks = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")
    ]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == (
        "The user asks about the cache."
    )
    assert "".join(d.get("content") or "" for d in deltas) == "It is warm."


def test_a_commentary_call_is_a_tool_call_in_both_dialects(scripted: ScriptedEngine) -> None:
    scripted.script = CALL
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    body = {"model": MODEL_ID, "messages": USER, "tools": [tool], "max_tokens": 64}
    choice = post(scripted, "/v1/chat/completions", body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == "Need the weather."
    call = choice["message"]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Oslo"})
    body = {"model": MODEL_ID, "messages": USER, "tools": [WEATHER], "max_tokens": 64}
    message = post(scripted, "/v1/messages", body).json()
    assert [b["type"] for b in message["content"]] == ["thinking", "tool_use"]
    assert message["content"][1]["input"] == {"city": "Oslo"}
    assert message["stop_reason"] == "tool_use"


def test_effort_in_the_messages_api_reaches_the_template(scripted: ScriptedEngine) -> None:
    body = {
        "model": MODEL_ID,
        "messages": USER,
        "max_tokens": 64,
        "output_config": {"effort": "max"},
    }
    message = post(scripted, "/v1/messages", body).json()
    assert "Reasoning: high" in prompt_of(scripted)
    assert [(b["type"], b.get("thinking") or b.get("text")) for b in message["content"]] == [
        ("thinking", "The user asks about the cache."),
        ("text", "It is warm."),
    ]


def test_thinking_display_omitted_empties_the_thinking(scripted: ScriptedEngine) -> None:
    body = {
        "model": MODEL_ID,
        "messages": USER,
        "max_tokens": 64,
        "thinking": {"type": "adaptive", "display": "omitted"},
    }
    message = post(scripted, "/v1/messages", body).json()
    assert message["content"][0] == {"type": "thinking", "thinking": "", "signature": ""}
    streamed = post(scripted, "/v1/messages", {**body, "stream": True}).text
    assert streamed.count("event: content_block_start") == 2 and "asks about" not in streamed


def test_max_tokens_zero_reads_the_prompt_and_returns_nothing(scripted: ScriptedEngine) -> None:
    body = {"model": MODEL_ID, "messages": USER, "max_tokens": 0}
    message = post(scripted, "/v1/messages", body).json()
    assert message["content"] == [] and message["stop_reason"] == "max_tokens"
    assert message["usage"]["output_tokens"] == 0 and message["usage"]["input_tokens"] > 0
    assert scripted.submitted[-1].sampling.max_tokens == 1


def test_engine_failure_after_the_stream_started_is_an_error_event(
    scripted: ScriptedEngine,
) -> None:
    scripted.fail = True
    body = {"model": MODEL_ID, "messages": USER, "max_tokens": 64}
    events = post(scripted, "/v1/messages", {**body, "stream": True}).text.split("\n\n")
    assert events[0].startswith("event: message_start")
    last = [e for e in events if e.strip()][-1]
    assert last.startswith("event: error")
    error = json.loads(last.split("data: ", 1)[1])
    assert error == {
        "type": "error",
        "error": {
            "type": "api_error",
            "message": "The model failed while generating the response.",
        },
    }
    collected = post(scripted, "/v1/messages", body)
    assert collected.status_code == 500 and collected.json()["error"]["type"] == "api_error"
