"""The prompt cache through the real server: a prefix outlives its slot and ``usage``
reports it as cached; the admin slot routes (admin keys only) save, erase and restore a
slot; ``/metrics`` shows the cache's sizes and hits; a tenant's name given to a new key
holder finds nothing of the old holder's."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from server_helpers import ADMIN_KEY, ALICE_KEY, BOB_KEY, MODEL_ID, make_keys

from homelab.cli.ps import format_prompt_cache
from homelab.engine.engine import Engine
from homelab.engine.prompt_cache.store import CacheConfig, PromptCache, folder_entries
from homelab.server.auth import KeyFile, KeyRing, Tenant, TenantLimiter, add_key, remove_keys
from homelab.server.config import ServerConfig
from homelab.server.middleware import TenantGate
from homelab.server.runner import start_server
from homelab.settings import Settings
from homelab.units import MIB


@pytest.fixture
def cached_server(
    demo_model: Callable[..., Path], tmp_path: Path
) -> Iterator[tuple[httpx.Client, PromptCache]]:
    """One slot, so every other request takes the slot away."""
    cache = PromptCache(CacheConfig(64 * MIB, 64 * MIB, tmp_path, min_tokens=32))
    settings = Settings(n_ctx=512, n_ctx_per_slot=512, n_parallel=1, n_threads=1)
    engine = Engine.load(
        demo_model("llama"), settings, record_calibration=False, prompt_cache=cache
    )
    config = ServerConfig(model_id=MODEL_ID, keys=make_keys(), default_max_tokens=4)
    handle = start_server(engine, config=config, prompt_cache=cache)
    with httpx.Client(base_url=handle.url, timeout=60) as http:
        yield http, cache
    handle.stop()
    engine.close()
    cache.close()


def complete(http: httpx.Client, key: str, prompt: list[int]) -> dict[str, int]:
    body = {"model": MODEL_ID, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    response = http.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    return {
        "prompt": usage["prompt_tokens"],
        "cached": usage["prompt_tokens_details"]["cached_tokens"],
    }


def long_prompt() -> list[int]:
    return [300 + secrets.randbelow(700) for _ in range(200)]


def admin(
    http: httpx.Client, method: str, path: str, key: str = ADMIN_KEY, **kw: object
) -> httpx.Response:
    return http.request(method, path, headers={"Authorization": f"Bearer {key}"}, **kw)  # type: ignore[arg-type]


def test_a_prefix_comes_back_as_cached_tokens(
    cached_server: tuple[httpx.Client, PromptCache],
) -> None:
    http, _ = cached_server
    prompt = long_prompt()
    assert complete(http, ALICE_KEY, prompt)["cached"] == 0
    assert complete(http, BOB_KEY, prompt)["cached"] == 0  # the same prompt: nothing of alice's
    usage = complete(http, ALICE_KEY, prompt)  # bob took the slot: restored
    assert usage["cached"] == usage["prompt"] - 1
    metrics = admin(http, "GET", "/metrics").text
    assert 'homelab_prompt_cache_hits_total{tier="ram"} 1' in metrics
    assert "homelab_prompt_cache_bytes" in metrics


def test_slots_are_saved_erased_and_restored_by_an_admin(
    cached_server: tuple[httpx.Client, PromptCache],
) -> None:
    http, cache = cached_server
    prompt = long_prompt()
    complete(http, ALICE_KEY, prompt)
    saved = admin(http, "POST", "/admin/slots/0?action=save")
    assert saved.status_code == 200, saved.text and saved.json()["n_tokens"] >= len(prompt)
    assert saved.json()["on_disk"] and cache.stats().disk_entries == 1  # written at once
    assert admin(http, "POST", "/admin/slots/0?action=erase").json()["n_tokens"] == 0
    assert admin(http, "GET", "/admin/slots").json()["data"][0]["cached_tokens"] == 0
    refused = admin(http, "POST", "/admin/slots/0?action=restore", json={})
    assert refused.status_code == 400 and "tenant" in refused.text
    restored = admin(http, "POST", "/admin/slots/0?action=restore", json={"tenant": "alice"})
    assert restored.status_code == 200, restored.text
    slot = admin(http, "GET", "/admin/slots").json()["data"][0]
    assert slot["tenant"] == "alice" and slot["cached_tokens"] >= len(prompt)
    usage = complete(http, ALICE_KEY, prompt)  # reuses the restored slot as its own
    assert usage["cached"] == usage["prompt"] - 1
    assert admin(http, "POST", "/admin/slots/7?action=save").status_code == 400
    assert admin(http, "POST", "/admin/slots/0?action=melt").status_code == 400
    report = admin(http, "GET", "/admin/prompt-cache").json()
    assert report["enabled"] and report["entries"][0]["tenant"] == "alice"
    line = format_prompt_cache(report)
    assert line.startswith("prompt cache: RAM") and "of 64.00 MiB" in line


@pytest.mark.parametrize("key, status", [("user-key", 403), ("admin-key", 200), ("", 401)])
def test_the_slot_routes_need_an_admin_key(key: str, status: int) -> None:
    """Through the gate alone, as a server on a public address sees it (a loopback-only
    server lets its local clients in, as for /metrics)."""

    async def app(scope: object, receive: object, send: Callable[..., object]) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[misc]
        await send({"type": "http.response.body", "body": b""})  # type: ignore[misc]

    ring = KeyRing.from_keys({"admin-key": Tenant("ops", admin=True), "user-key": Tenant("u")})
    gate = TenantGate(app, keys=ring, limiter=TenantLimiter(), bound_to_loopback=False)
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    scope = {
        "type": "http", "method": "POST", "path": "/admin/slots/0", "query_string": b"",
        "client": ("203.0.113.9", 50000), "headers": headers,
    }  # fmt: skip
    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    async def receive() -> dict[str, object]:
        return {"type": "http.disconnect"}

    asyncio.run(gate(scope, receive, send))  # type: ignore[arg-type]
    assert sent[0]["status"] == status


def test_a_name_given_to_a_new_key_holder_finds_nothing_of_the_old_ones(
    demo_model: Callable[..., Path], tmp_path: Path
) -> None:
    """alice's prompt is in her slot and her saved state; her keys are removed and the name
    given to someone new while the server runs: the server re-reads the keys file, the old
    key stops working, the new holder's same prompt is not cached (``cached_tokens`` does not
    answer "was this their prompt?"), and the old holder's states are deleted — in RAM, on
    disk, and still after the server stops (no slot saves them back)."""
    keys_path, folder = tmp_path / "keys.toml", tmp_path / "states"
    old_key, bob_key = add_key(keys_path, "alice"), add_key(keys_path, "bob")
    keys = KeyFile(keys_path, check_every_s=0)
    cache = PromptCache(CacheConfig(64 * MIB, 64 * MIB, folder, min_tokens=32))
    settings = Settings(n_ctx=512, n_ctx_per_slot=512, n_parallel=1, n_threads=1)
    engine = Engine.load(
        demo_model("llama"), settings, record_calibration=False, prompt_cache=cache
    )
    config = ServerConfig(model_id=MODEL_ID, keys=keys, default_max_tokens=4)
    handle = start_server(engine, config=config, prompt_cache=cache)
    prompt = long_prompt()
    with httpx.Client(base_url=handle.url, timeout=60) as http:
        complete(http, old_key, prompt)
        complete(http, bob_key, long_prompt())  # takes the slot: alice's state is saved
        complete(http, old_key, prompt)  # restored, and in the slot again
        old = {e.identity for e in cache.entries() if e.tenant == "alice"}
        assert len(old) == 1 and cache.stats().hits_ram == 1
        remove_keys(keys_path, "alice")
        new_key = add_key(keys_path, "alice")
        assert complete(http, new_key, prompt)["cached"] == 0
        refused = http.post("/v1/completions", headers={"Authorization": f"Bearer {old_key}"})
        assert refused.status_code == 401
        _wait_until(lambda: not old & {e.identity for e in cache.entries()})
    handle.stop()
    engine.close()
    cache.close()
    left = {e.identity for e in folder_entries(folder)}
    assert not old & left and any(i.startswith("alice#") for i in left)  # the new holder's


def _wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within 30 s"
        time.sleep(0.05)
