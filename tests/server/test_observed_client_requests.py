"""Requests recorded from the real clients, replayed against the real server on the tiny demo
llama (``tests/server/test_real_clients.py`` runs the clients themselves, where installed).

``traces/observed_*.json`` hold what Claude Code 2.1.197, Codex CLI 0.171.0 and OpenCode
1.18.33 sent to ``homelab serve`` through a recording proxy (each file's ``observed`` field
says how): headers and bodies as sent, but for long prose (system prompts, tool descriptions),
which keeps its first words and is filled to its length with filler. Claude Code's carry what
the traces written from documentation did not: a message with the role ``system`` among the
turns (the ``mid-conversation-system-2026-04-07`` beta: its agent and skill lists after the
first user message), ``thinking: {"type": "adaptive"}``, ``context_management``,
``output_config.effort`` and ``?beta=true``. homelab answered its first request with a 400
(``messages[1].role``) until a system message among the turns was accepted: it is rendered
as the user's text where it stands, so templates that refuse or drop a late system message
(Qwen3.5, Mistral, Gemma, gpt-oss) still see it, and the prompt stays a prefix of the next
turn's. Codex's and OpenCode's were answered as recorded; they are kept so CI, which has no
clients, still sends their shapes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from homelab.engine.engine import Engine
from homelab.server.anthropic import template_messages
from homelab.server.anthropic_protocol import MessagesRequest
from homelab.server.auth import KeyRing, Tenant, TenantLimits
from homelab.server.config import ServerConfig
from homelab.server.runner import ServerHandle, start_server
from homelab.settings import Settings

pytestmark = pytest.mark.slow  # four 10-20K-token prompts read on the CPU

TRACES = Path(__file__).parent / "traces"
KEY = "hl-observed-clients"
N_CTX = 32768  # the recorded prompts are 10-20K tokens in the tiny model's 1024-token vocabulary
REPLAY_MAX_TOKENS = 4


def recorded_calls(client: str = "claude_code") -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = json.loads((TRACES / f"observed_{client}.json").read_text())[
        "calls"
    ]
    return calls


@pytest.fixture(scope="module")
def observed_server(demo_model: Callable[..., Path]) -> Iterator[ServerHandle]:
    settings = Settings(n_ctx=2 * N_CTX, n_ctx_per_slot=N_CTX, n_parallel=2)
    engine = Engine.load(demo_model("llama"), settings, record_calibration=False)
    keys = KeyRing.from_keys({KEY: Tenant("observed", limits=TenantLimits())})
    aliases = (("claude-*", "local"), ("gpt-*", "local"))
    config = ServerConfig(model_id="local", keys=keys, aliases=aliases)
    handle = start_server(engine, config=config)
    yield handle
    handle.stop()
    engine.close()


def post(server: ServerHandle, call: dict[str, Any], body: dict[str, Any]) -> httpx.Response:
    headers = {**call["headers"], "authorization": f"Bearer {KEY}"}  # ANTHROPIC_AUTH_TOKEN
    return httpx.post(server.url + call["path"], json=body, headers=headers, timeout=300)


def sse_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_the_recorded_turns_succeed_in_claude_codes_shape(observed_server: ServerHandle) -> None:
    for call in recorded_calls():
        body = {**call["body"], "max_tokens": REPLAY_MAX_TOKENS}
        assert any(m["role"] == "system" for m in body["messages"])
        response = post(observed_server, call, body)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.text)
        kinds = [event["type"] for event in events]
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        assert events[0]["message"]["model"] == body["model"]  # the name it asked for
        delta = next(event for event in events if event["type"] == "message_delta")
        assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
        assert delta["usage"]["input_tokens"] > 1000


def test_count_tokens_takes_the_recorded_request(observed_server: ServerHandle) -> None:
    call = recorded_calls()[0]
    fields = ("model", "messages", "system", "tools", "thinking", "output_config")
    body = {k: call["body"][k] for k in fields}
    counted = post(observed_server, {**call, "path": "/v1/messages/count_tokens"}, body)
    assert counted.status_code == 200, counted.text
    without = {**body, "messages": [m for m in body["messages"] if m["role"] != "system"]}
    fewer = post(observed_server, {**call, "path": "/v1/messages/count_tokens"}, without)
    assert fewer.status_code == 200, fewer.text
    assert counted.json()["input_tokens"] > fewer.json()["input_tokens"] + 200  # it is rendered


def test_a_later_turn_reuses_the_whole_prompt(observed_server: ServerHandle) -> None:
    """Within one session Claude Code resends turn 1 with the reply and the next user message
    after it: the system message folded into the user's turn keeps turn 1 a prefix."""
    call = recorded_calls()[0]
    first = {**call["body"], "max_tokens": REPLAY_MAX_TOKENS}
    events = sse_events(post(observed_server, call, first).text)
    reply = "".join(
        e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta"
    )
    later = {
        **first,
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": [{"type": "text", "text": reply or "Hello."}]},
            {"role": "user", "content": [{"type": "text", "text": "Now say goodbye"}]},
        ],
    }
    usage = next(e for e in sse_events(post(observed_server, call, later).text) if "usage" in e)
    start = next(e for e in events if e["type"] == "message_start")["message"]["usage"]
    later_usage = usage.get("usage") or usage["message"]["usage"]
    assert later_usage["cache_read_input_tokens"] >= start["input_tokens"] - 1


def parsed(body: dict[str, Any]) -> MessagesRequest:
    return MessagesRequest.model_validate_json(json.dumps(body))


def test_a_system_message_among_the_turns_is_the_users_text_where_it_stands() -> None:
    body = recorded_calls()[1]["body"]  # user, system, assistant, user
    messages, prefill = template_messages(parsed(body))
    assert prefill == ""
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    lists = body["messages"][1]["content"]
    assert messages[1]["content"].startswith(body["messages"][0]["content"][0]["text"].strip())
    assert messages[1]["content"].endswith(lists)
    assert "Available agent types" not in messages[0]["content"]  # not moved to the front


def test_system_messages_hold_text_and_do_not_come_between_a_call_and_its_result() -> None:
    call = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "text of a"}
    turns = [
        {"role": "user", "content": "read a"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
        {"role": "system", "content": [{"type": "text", "text": "The user is away."}]},
    ]
    body = {"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": turns}
    rendered = template_messages(parsed(body))[0]
    assert [m["role"] for m in rendered] == ["user", "assistant", "tool", "user"]
    assert rendered[-1]["content"] == "The user is away."
    between = {**body, "messages": [turns[0], turns[1], turns[3], turns[2]]}
    with pytest.raises(ValueError, match="not a tool_use id of the assistant message just before"):
        parsed(between)  # a tool_result still answers the message right before it
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    with_image = {**body, "messages": [turns[0], {"role": "system", "content": [image]}]}
    with pytest.raises(ValueError, match="'image' blocks are not allowed here"):
        parsed(with_image)


def replayed(server: ServerHandle, call: dict[str, Any]) -> tuple[int, int]:
    """One recorded OpenAI-style call, its output capped: (prompt tokens, cached tokens), after
    checking the stream has the shape its client reads."""
    cap = "max_output_tokens" if call["path"].startswith("/v1/responses") else "max_tokens"
    response = post(server, call, {**call["body"], cap: REPLAY_MAX_TOKENS})
    assert response.status_code == 200, response.text
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    if cap == "max_output_tokens":  # Codex: response.created ... response.completed
        events = [json.loads(line) for line in lines]
        assert events[0]["type"] == "response.created", events[0]
        assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
        assert any(e["type"] == "response.output_item.done" for e in events)
        usage = events[-1]["response"]["usage"]
        return usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]
    assert lines[-1] == "[DONE]"  # OpenCode: chunks, then the usage chunk it asked for
    chunks = [json.loads(line) for line in lines[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    usage = chunks[-1]["usage"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def test_codexs_recorded_turns_succeed_and_the_second_reuses_the_first(
    observed_server: ServerHandle,
) -> None:
    """Codex 0.171.0: developer messages, item ids, a ``namespace`` and a ``web_search`` tool,
    ``store: false``, ``include``, ``prompt_cache_key``, ``client_metadata``; on resume, the
    whole history again (no ``previous_response_id``)."""
    first, second = (replayed(observed_server, call) for call in recorded_calls("codex"))
    assert first[0] > 5000
    assert second[1] >= first[0] - 1  # turn 1's whole prompt, read from the cache


def test_opencodes_recorded_title_probe_and_turn_succeed(observed_server: ServerHandle) -> None:
    title, turn = recorded_calls("opencode")
    assert "tools" not in title["body"] and turn["body"]["tool_choice"] == "auto"
    assert replayed(observed_server, title)[0] > 100
    assert replayed(observed_server, turn)[0] > 5000
