"""Prefix-cache isolation through HTTP: the tenant comes from the key, nothing else.

A tenant that has never sent anything has nothing cached, so its first request reports
``cached_tokens == 0`` even when another tenant just cached the identical prompt. (Later
requests of any tenant share the chat template's first tokens with its own earlier ones.)
"""

from __future__ import annotations

import secrets

import httpx
import openai
from server_helpers import ALICE_KEY, BOB_KEY, FRESH_KEYS, MODEL_ID

from homelab.server.runner import ServerHandle

HOSTILE_FIELDS = {
    "cache_salt": "alice",
    "id_slot": 0,
    "slot_id": 0,
    "cache_prompt": True,
    "n_keep": -1,
    "tenant": "alice",
    "user": "alice",
}
CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"


def unique_messages() -> list[dict[str, str]]:
    words = " ".join(
        secrets.choice(["cache", "token", "layer", "model", "speed"]) for _ in range(60)
    )
    return [{"role": "user", "content": f"{secrets.token_hex(4)} {words}"}]


def unique_token_prompt() -> list[int]:
    return [300 + secrets.randbelow(700) for _ in range(64)]  # no BOS: nothing shared by chance


def post(http: httpx.Client, key: str, path: str, body: dict[str, object]) -> dict[str, int]:
    response = http.post(
        path,
        json={"model": MODEL_ID, "max_tokens": 2, **body},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    return {
        "prompt": usage["prompt_tokens"],
        "cached": usage["prompt_tokens_details"]["cached_tokens"],
    }


def test_same_key_reuses_the_cache_another_key_does_not(http: httpx.Client) -> None:
    prompt = {"prompt": unique_token_prompt()}
    first = post(http, ALICE_KEY, TEXT, prompt)
    again = post(http, ALICE_KEY, TEXT, prompt)
    other = post(http, BOB_KEY, TEXT, prompt)
    assert first["cached"] == 0
    assert again["cached"] >= again["prompt"] - 1  # all but the last prompt token (re-evaluated)
    assert other["cached"] == 0
    assert post(http, BOB_KEY, TEXT, prompt)["cached"] > 0  # bob's own cache works too


def test_chat_through_the_sdk_is_isolated(client: openai.OpenAI, server: ServerHandle) -> None:
    messages = unique_messages()
    first = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=2)
    again = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=2)
    with openai.OpenAI(
        base_url=server.base_url, api_key=FRESH_KEYS["carol"], max_retries=0
    ) as carol:
        other = carol.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=2)
    assert again.usage and first.usage and other.usage
    assert (
        again.usage.prompt_tokens_details.cached_tokens
        > first.usage.prompt_tokens_details.cached_tokens
    )  # type: ignore[union-attr]
    assert again.usage.prompt_tokens_details.cached_tokens >= 0.9 * again.usage.prompt_tokens  # type: ignore[union-attr]
    assert other.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]


def test_slot_and_salt_fields_cannot_reach_another_tenants_cache(http: httpx.Client) -> None:
    tokens = unique_token_prompt()
    messages = unique_messages()
    for _ in range(2):  # surely cached for alice
        post(http, ALICE_KEY, TEXT, {"prompt": tokens})
        post(http, ALICE_KEY, CHAT, {"messages": messages})
    assert post(http, FRESH_KEYS["dave"], TEXT, {"prompt": tokens, **HOSTILE_FIELDS})["cached"] == 0
    assert (
        post(http, FRESH_KEYS["erin"], CHAT, {"messages": messages, **HOSTILE_FIELDS})["cached"]
        == 0
    )
    assert post(http, BOB_KEY, TEXT, {"prompt": tokens, **HOSTILE_FIELDS})["cached"] == 0


def test_streamed_usage_reports_tenant_local_cached_tokens(http: httpx.Client) -> None:
    tokens = unique_token_prompt()

    def streamed_cached(key: str) -> int:
        body = {
            "model": MODEL_ID,
            "prompt": tokens,
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with http.stream(
            "POST", TEXT, json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return int(
            httpx.Response(200, content=events[-2]).json()["usage"]["prompt_tokens_details"][
                "cached_tokens"
            ]
        )

    assert streamed_cached(ALICE_KEY) == 0
    assert streamed_cached(ALICE_KEY) > 0
    assert streamed_cached(FRESH_KEYS["frank"]) == 0
