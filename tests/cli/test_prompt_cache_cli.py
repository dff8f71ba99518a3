"""``homelab prompt-cache``: list, size and clear the saved prompt states, per tenant and per model,
from the data folder (read without deleting anything) or through a running server. The states
are plain bytes written by the store (the CLI never interprets them), except with the server,
whose states are a real model's."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from homelab.cli import main
from homelab.cli.prompt_cache import cache_folder
from homelab.engine.engine import Engine
from homelab.engine.prompt_cache import disk
from homelab.engine.prompt_cache.key import ModelKey
from homelab.engine.prompt_cache.store import CacheConfig, PromptCache, folder_entries
from homelab.gguf.identity import model_identity
from homelab.server.auth import KeyRing, Tenant
from homelab.server.config import ServerConfig
from homelab.server.runner import start_server
from homelab.settings import Settings
from homelab.units import MIB

LAYOUT = "k=f16 v=f16 fa=0 cells=512 streams=1 swa_full=0"


@pytest.fixture
def saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_model: Callable[..., Path]
) -> ModelKey:
    monkeypatch.setenv("HOMELAB_HOME", str(tmp_path))
    model = ModelKey(model_identity(demo_model("llama")), LAYOUT)
    other = ModelKey("0" * 32, LAYOUT)
    cache = PromptCache(CacheConfig(1 << 20, 1 << 24, cache_folder(), min_tokens=1))
    cache.put(model, "alice", (1, 2, 3), b"a" * 100)
    cache.put(model, "bob", (1, 2, 4), b"b" * 200)
    cache.put(other, "alice", (1, 2, 5), b"c" * 300)
    cache.close()
    return model


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_list_and_size(saved: ModelKey, capsys: pytest.CaptureFixture[str]) -> None:
    listed = run_json(capsys, "prompt-cache")
    assert isinstance(listed, list) and len(listed) == 3
    alice = run_json(capsys, "prompt-cache", "list", "--tenant", "alice")
    assert isinstance(alice, list) and {e["n_bytes"] for e in alice} == {100, 300}
    size = run_json(capsys, "prompt-cache", "size")
    assert isinstance(size, dict) and size["total_bytes"] == 600
    assert main(["prompt-cache"]) == 0 and "alice" in capsys.readouterr().out


def test_clear_per_tenant_and_per_model(
    saved: ModelKey, capsys: pytest.CaptureFixture[str], demo_model: Callable[..., Path]
) -> None:
    model_path = str(demo_model("llama"))
    assert run_json(
        capsys, "prompt-cache", "clear", "--tenant", "alice", "--model", model_path
    ) == {"removed": 1}
    left = run_json(capsys, "prompt-cache")
    assert isinstance(left, list)
    assert {(e["tenant"], e["model_id"] == saved.model_id) for e in left} == {
        ("bob", True),
        ("alice", False),
    }
    assert run_json(capsys, "prompt-cache", "clear") == {"removed": 2}
    assert not list(cache_folder().rglob("*.state"))


def test_plan_shows_the_ram_serve_sets_aside(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "demo", "--no-verify", "--ram", "8GiB"]
    assert main([*argv, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*argv, "--prompt-cache-ram-mib", "512", "--json"]) == 0
    reserved = json.loads(capsys.readouterr().out)
    assert _host_budget(plain) - _host_budget(reserved) == 512 * 1024 * 1024
    assert main([*argv, "--prompt-cache-ram-mib", "512"]) == 0
    assert "set aside on the host: 0.50 GiB for the prompt cache" in capsys.readouterr().out


def _host_budget(plan: object) -> int:
    assert isinstance(plan, dict)
    return int(plan["hardware"]["devices"][0]["budget_bytes"])


def test_listing_the_folder_deletes_nothing(
    saved: ModelKey, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a server the verb reads the folder: a server's write in progress (a temporary
    file of a live process: this one's) and a file it cannot read are left where they are."""
    folder = next(cache_folder().glob("*/*"))
    writing = folder / f"{'a' * 24}.state{disk.TEMP_MARK}{os.getpid()}"
    writing.write_bytes(b"half a state")
    unreadable = folder / f"{'b' * 24}.state"
    unreadable.write_bytes(b"not a state")
    for action in ("list", "size"):
        assert main(["prompt-cache", action]) == 0
    assert writing.exists() and unreadable.exists()
    capsys.readouterr()
    listed = run_json(capsys, "prompt-cache")
    assert isinstance(listed, list) and len(listed) == 3
    assert run_json(capsys, "prompt-cache", "clear") == {"removed": 3}
    assert writing.exists() and unreadable.exists()  # not states: not the verb's to delete


def test_with_a_server_running_the_verb_goes_through_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    demo_model: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The server holds states in RAM the folder does not have, and alice's cells in its
    slot: ``list`` shows the server's states; ``clear --tenant alice`` deletes hers from RAM
    and disk, and they stay deleted when the server stops (its slot is not saved back)."""
    monkeypatch.setenv("HOMELAB_HOME", str(tmp_path))
    alice_key, bob_key = "hl-cli-alice", "hl-cli-bob"
    keys = KeyRing.from_keys({alice_key: Tenant("alice"), bob_key: Tenant("bob")})
    cache = PromptCache(CacheConfig(64 * MIB, 64 * MIB, cache_folder(), min_tokens=32))
    settings = Settings(n_ctx=512, n_ctx_per_slot=512, n_parallel=1, n_threads=1)
    engine = Engine.load(
        demo_model("llama"), settings, record_calibration=False, prompt_cache=cache
    )
    handle = start_server(engine, config=ServerConfig(model_id="m", keys=keys), prompt_cache=cache)
    with httpx.Client(base_url=handle.url, timeout=60) as http:
        for key in (alice_key, bob_key, alice_key):  # each takes the one slot from the other
            _complete(http, key)
        cache.flush()  # alice's first state and bob's on disk; alice's second in her slot
        listed = run_json(capsys, "prompt-cache")
        assert isinstance(listed, list) and {e["tenant"] for e in listed} == {"alice", "bob"}
        assert all(e["in_ram"] for e in listed)  # the server's view (the folder's has no RAM)
        assert run_json(capsys, "prompt-cache", "clear", "--tenant", "alice") == {"removed": 1}
        assert {e.tenant for e in cache.entries()} == {"bob"}
        assert {e.tenant for e in folder_entries(cache_folder())} == {"bob"}
    handle.stop()
    engine.close()  # saves its slot's state: not alice's any more
    cache.close()
    assert {e.tenant for e in folder_entries(cache_folder())} == {"bob"}


def _complete(http: httpx.Client, key: str) -> None:
    prompt = [300 + secrets.randbelow(700) for _ in range(200)]
    body = {"model": "m", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    response = http.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
