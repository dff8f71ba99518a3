"""What agent clients need from the endpoint (issue #24), against a real server on the tiny
demo model: volatile system text stripped before rendering (the prefix cache survives
Claude Code's billing header), model aliases, ``/v1/models`` with context and capabilities,
stored responses per tenant (``previous_response_id``, ``GET``/``DELETE``), hosted tools
ignored with a warning, and earlier reasoning accepted back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_helpers import ALICE_KEY, BOB_KEY, MODEL_ID, N_CTX_PER_SLOT, make_keys

from homelab.engine.engine import Engine
from homelab.errors import ConfigError
from homelab.server.config import ServerConfig, parse_alias, read_serve_file
from homelab.server.history import stable_messages
from homelab.server.response_store import ResponseStore
from homelab.server.responses import messages
from homelab.server.responses_protocol import decoded_reasoning, encoded_reasoning
from homelab.server.runner import ServerHandle, start_server

SYSTEM = "You are a careful coding agent. Read the files before you change them. " * 3


def billing(cch: str) -> str:
    return f"x-anthropic-billing-header: cc_version=2.1.37.e1f; cc_entrypoint=cli; cch={cch};"


@pytest.fixture(scope="module")
def agent_server(engine: Engine) -> Iterator[ServerHandle]:
    config = ServerConfig(
        model_id=MODEL_ID,
        keys=make_keys(),
        default_max_tokens=4,
        aliases=(("claude-*", MODEL_ID), ("gpt-5*", MODEL_ID)),
        stored_responses=8,
    )
    handle = start_server(engine, config=config)
    yield handle
    handle.stop()


@pytest.fixture
def alice(agent_server: ServerHandle) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {ALICE_KEY}"}
    with httpx.Client(base_url=agent_server.url, headers=headers, timeout=60) as client:
        yield client


@pytest.fixture
def bob(agent_server: ServerHandle) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {BOB_KEY}"}
    with httpx.Client(base_url=agent_server.url, headers=headers, timeout=60) as client:
        yield client


def message(http: httpx.Client, cch: str, text: str) -> dict[str, object]:
    body = {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 1,
        "system": [
            {"type": "text", "text": billing(cch)},
            {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [{"role": "user", "content": text}],
    }
    response = http.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_the_billing_header_does_not_break_the_prefix_cache(alice: httpx.Client) -> None:
    message(alice, "1a2b3", "list the files")
    usage = message(alice, "9f8e7", "list the files")["usage"]  # a new cch, nothing else
    assert isinstance(usage, dict)
    assert usage["input_tokens"] == 1  # every token but the last one (sampled from) is cached


def test_volatile_text_is_removed_from_system_messages_only() -> None:
    patterns = ServerConfig().volatile_patterns
    messages = [
        {"role": "system", "content": billing("00000") + "\nYou are helpful."},
        {"role": "system", "content": billing("11111")},  # nothing else: dropped
        {"role": "user", "content": billing("22222")},  # the user's own text stays
    ]
    assert stable_messages(messages, patterns, keep_reasoning=True) == [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": billing("22222")},
    ]
    custom = (*patterns, r"(?m)^Today's date: .*$")
    dated = [{"role": "system", "content": "Today's date: 2026-12-03\nBe brief."}]
    assert stable_messages(dated, custom, True) == [{"role": "system", "content": "\nBe brief."}]


def test_earlier_reasoning_is_kept_or_dropped_by_the_flag() -> None:
    turn = {"role": "assistant", "content": "done", "reasoning_content": "I read it."}
    assert stable_messages([turn], (), keep_reasoning=True) == [turn]
    assert stable_messages([turn], (), keep_reasoning=False) == [
        {"role": "assistant", "content": "done"}
    ]


def test_aliases_reach_the_model_and_other_names_are_404(alice: httpx.Client) -> None:
    for name in ("claude-haiku-4-5", "gpt-5-codex", MODEL_ID):
        body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        assert alice.post("/v1/chat/completions", json=body).status_code == 200
    body = {"model": "llama-70b", "messages": [{"role": "user", "content": "hi"}]}
    response = alice.post("/v1/chat/completions", json=body)
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


def test_alias_flags_and_serve_file(tmp_path: Path) -> None:
    assert parse_alias("claude-*=qwen3") == ("claude-*", "qwen3")
    with pytest.raises(ConfigError, match="PATTERN=MODEL"):
        parse_alias("claude-*")
    file = tmp_path / "serve.toml"
    file.write_text(
        '[aliases]\n"gpt-*" = "tiny"\n[prompt]\nstrip_patterns = ["^Date: .*$"]\n'
        "history_reasoning = false\n"
    )
    settings = read_serve_file(file)
    assert settings.aliases == (("gpt-*", "tiny"),) and settings.strip_patterns == ("^Date: .*$",)
    assert settings.history_reasoning is False
    file.write_text("[aliases]\nx = 3\n")
    with pytest.raises(ConfigError, match=r"serve\.toml"):
        read_serve_file(file)
    with pytest.raises(ConfigError, match="regular expression"):
        ServerConfig(volatile_patterns=("([unclosed",))


def test_models_report_context_and_capabilities(alice: httpx.Client) -> None:
    card = alice.get("/v1/models").json()["data"][0]
    assert card["id"] == MODEL_ID
    assert card["context_length"] == card["max_model_len"] == N_CTX_PER_SLOT
    assert card["meta"]["n_ctx"] == N_CTX_PER_SLOT and card["meta"]["n_ctx_train"] > 0
    assert card["supports"]["vision"] is False and "completion" in card["capabilities"]
    assert card["architecture"]["input_modalities"] == ["text"]
    assert alice.get(f"/v1/models/{MODEL_ID}").json()["context_length"] == N_CTX_PER_SLOT


def respond(http: httpx.Client, **fields: object) -> httpx.Response:
    body = {"model": "gpt-5-codex", "max_output_tokens": 2, "instructions": SYSTEM, **fields}
    return http.post("/v1/responses", json=body)


def test_stored_responses_continue_per_tenant(alice: httpx.Client, bob: httpx.Client) -> None:
    first = respond(alice, input="read the file")
    assert first.status_code == 200 and first.json()["store"] is True
    first_id = first.json()["id"]
    second = respond(alice, input="now change it", previous_response_id=first_id).json()
    assert second["previous_response_id"] == first_id
    assert second["usage"]["input_tokens"] > first.json()["usage"]["input_tokens"]
    assert second["usage"]["input_tokens_details"]["cached_tokens"] > 0
    assert alice.get(f"/v1/responses/{first_id}").json()["id"] == first_id
    for sneaky in (
        bob.get(f"/v1/responses/{first_id}"),
        bob.delete(f"/v1/responses/{first_id}"),
        respond(bob, input="hi", previous_response_id=first_id),
    ):
        assert sneaky.status_code == 404 and sneaky.json()["error"]["code"] == "response_not_found"
    deleted = alice.delete(f"/v1/responses/{first_id}").json()
    assert deleted == {"id": first_id, "object": "response.deleted", "deleted": True}
    assert alice.get(f"/v1/responses/{first_id}").status_code == 404


def test_store_false_keeps_nothing(alice: httpx.Client) -> None:
    response = respond(alice, input="secret", store=False).json()
    assert response["store"] is False
    assert alice.get(f"/v1/responses/{response['id']}").status_code == 404


def test_hosted_tools_are_ignored_with_a_warning(alice: httpx.Client) -> None:
    tools = [
        {"type": "function", "name": "shell", "parameters": {"type": "object"}},
        {"type": "web_search"},
        {"type": "local_shell"},
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
    ]
    for stream in (False, True):
        response = respond(alice, input="go", tools=tools, stream=stream)
        assert response.status_code == 200, response.text
        assert "custom, local_shell, web_search" in response.headers["warning"]
    echoed = respond(alice, input="go", tools=tools).json()["tools"]
    assert [tool["type"] for tool in echoed] == ["function"]


def test_reasoning_items_and_include_are_accepted(alice: httpx.Client) -> None:
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Look first."}],
        "encrypted_content": "gAAAA-from-another-server",
    }
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix"}]},
        reasoning,
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    response = respond(alice, input=items, include=["reasoning.encrypted_content"])
    assert response.status_code == 200, response.text


def test_the_store_is_bounded_in_count_bytes_and_time() -> None:
    now = [0.0]
    store = ResponseStore(max_entries=2, max_bytes=2_000, ttl_s=60, clock=lambda: now[0])
    for index in range(3):
        store.put("alice", {"id": f"r{index}", "output": []}, ["x"])
    assert len(store) == 2  # the oldest went first
    with pytest.raises(Exception, match="No response"):
        store.get("alice", "r0")
    store.put("alice", {"id": "big", "output": ["y" * 1_960]}, [])
    assert len(store) == 1 and store.total_bytes <= 2_000  # r1, r2 dropped for its bytes
    store.put("alice", {"id": "huge", "output": ["z" * 5_000]}, [])  # alone too big: not kept
    assert len(store) == 1
    now[0] = 61.0
    with pytest.raises(Exception, match="No response"):
        store.get("alice", "big")
    assert len(store) == 0 and store.total_bytes == 0


def test_one_tenant_filling_the_store_drops_only_its_own_oldest() -> None:
    """8 responses and 8 KB for all, a quarter of each per tenant: alice storing response
    after response (in count, then in bytes) never pushes out bob's one."""
    store = ResponseStore(max_entries=8, max_bytes=8_000, ttl_s=60)  # a share: 2, 2 KB
    store.put("bob", {"id": "b0", "output": []}, ["x"])
    for index in range(20):
        store.put("alice", {"id": f"a{index}", "output": []}, ["x"])
    assert store.get("bob", "b0") and len(store) == 8
    assert store.tenant_usage("alice")[0] == 7  # its own oldest went
    store.get("alice", "a19")
    for index in range(4):
        store.put("alice", {"id": f"big{index}", "output": ["y" * 1_900]}, [])
    assert store.get("bob", "b0") and store.total_bytes <= 8_000
    store.put("bob", {"id": "b1", "output": []}, ["x"])  # bob within its share: alice pays
    assert store.get("bob", "b0") and store.get("bob", "b1") and len(store) <= 8


def test_a_tenant_filling_the_servers_store_leaves_anothers_response(
    alice: httpx.Client, bob: httpx.Client
) -> None:
    """The real server's store (8 responses, a quarter each per tenant)."""
    kept = respond(bob, input="remember me").json()["id"]
    for index in range(10):
        assert respond(alice, input=f"note {index}").status_code == 200
    assert bob.get(f"/v1/responses/{kept}").status_code == 200


def test_reasoning_items_open_their_assistant_turn() -> None:
    sealed = encoded_reasoning("I should read cart.py first.")
    items = [
        {"type": "message", "role": "user", "content": "fix it"},
        {"type": "reasoning", "summary": [], "encrypted_content": sealed},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Done."}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Fixed."}],
        },
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "dangling"}]},
    ]
    turns = messages(None, items)
    assert [m["role"] for m in turns] == ["user", "assistant", "tool", "assistant"]
    assert turns[1]["reasoning_content"] == "I should read cart.py first."
    assert turns[1]["tool_calls"][0]["id"] == "c1"
    assert turns[3] == {"role": "assistant", "content": "Fixed.", "reasoning_content": "Done."}
    assert decoded_reasoning("gAAAA-someone-else's") == ""


def test_chat_history_with_reasoning_is_accepted(alice: httpx.Client) -> None:
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": "Greet back."},
        {"role": "user", "content": "bye"},
    ]
    body = {"model": MODEL_ID, "messages": history, "max_tokens": 1}
    assert alice.post("/v1/chat/completions", json=body).status_code == 200
