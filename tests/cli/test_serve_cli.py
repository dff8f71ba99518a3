"""``homelab serve``: keys management and a real server process end to end."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from homelab.cli import main
from homelab.cli.prompt_cache import cache_folder
from homelab.cli.serve import _keys_for
from homelab.engine.prompt_cache.key import ModelKey
from homelab.engine.prompt_cache.store import CacheConfig, PromptCache, folder_entries
from homelab.server.auth import default_keys_path, load_keys


@pytest.fixture(autouse=True)
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOMELAB_HOME", str(tmp_path / "home"))  # keys files stay per test
    return tmp_path / "home"


def test_new_key_is_printed_once_and_stored_hashed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--json", "--new-key", "alice", "--admin"]) == 0
    shown = json.loads(capsys.readouterr().out)
    path = default_keys_path()
    assert shown["tenant"] == "alice" and shown["keys_file"] == str(path)
    assert shown["api_key"] not in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    tenant = load_keys(path).authenticate(shown["api_key"])
    assert tenant is not None and tenant.admin


def test_binding_beyond_loopback_generates_a_key(tmp_path: Path) -> None:
    keys_path = tmp_path / "keys.toml"
    args = argparse.Namespace(host="0.0.0.0", api_key_file=None)
    ring, key = _keys_for(args, keys_path)
    assert ring is not None and key is not None and ring.authenticate(key) is not None
    assert stat.S_IMODE(keys_path.stat().st_mode) == 0o600
    again, no_new_key = _keys_for(args, keys_path)  # existing file: used, nothing generated
    assert no_new_key is None and again is not None and again.authenticate(key) is not None
    local_ring, local_key = _keys_for(
        argparse.Namespace(host="127.0.0.1", api_key_file=None), tmp_path / "none.toml"
    )
    assert local_ring is None and local_key is None


def test_removing_a_tenants_keys_deletes_its_saved_states(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No server running: the verb deletes the tenant's states in the data folder itself."""
    assert main(["serve", "--json", "--new-key", "alice"]) == 0
    assert main(["serve", "--json", "--new-key", "bob"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    ring = load_keys(default_keys_path())
    alice, bob = (ring.authenticate(doc["api_key"]) for doc in shown)
    assert alice is not None and bob is not None
    cache = PromptCache(CacheConfig(1 << 20, 1 << 20, cache_folder(), min_tokens=1))
    model = ModelKey("0" * 32, "k=f16 v=f16 fa=0 cells=512 streams=1 swa_full=0")
    cache.put(model, alice.identity, (1, 2, 3), b"a" * 100)
    cache.put(model, bob.identity, (1, 2, 3), b"b" * 100)
    cache.close()
    assert main(["serve", "--remove-keys", "alice"]) == 0
    assert "its 1 saved prompt states deleted" in capsys.readouterr().out
    assert [e.tenant for e in folder_entries(cache_folder())] == ["bob"]
    assert load_keys(default_keys_path()).authenticate(shown[0]["api_key"]) is None
    assert main(["serve", "--remove-keys", "alice"]) == 1  # no such tenant any more
    assert "no tenant 'alice'" in capsys.readouterr().err


def test_serve_without_model_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve"]) == 1
    assert "MODEL" in capsys.readouterr().err


SECRET = "zebra quartz prompt"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_homelab_serve_serves_the_openai_sdk(demo_model: Callable[..., Path]) -> None:
    port = free_port()
    command = [sys.executable, "-m", "homelab.cli", "serve", str(demo_model("llama")), "--json"]
    command += [
        "--port",
        str(port),
        "--model-id",
        "demo",
        "--ctx",
        "512",
        "--parallel",
        "2",
        "--threads",
        "1",
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    try:
        assert process.stdout is not None
        started = json.loads(process.stdout.readline())
        assert started["base_url"] == f"http://127.0.0.1:{port}/v1" and started["auth"] is False
        deadline = time.monotonic() + 60
        while _health_status(port) != 200:
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
        with openai.OpenAI(base_url=started["base_url"], api_key="unused", max_retries=0) as sdk:
            reply = sdk.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": SECRET}], max_tokens=3
            )
            typed = sdk.chat.completions.create(  # the MODEL as typed names it too
                model=str(demo_model("llama")),
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=2,
            )
        assert reply.usage is not None and reply.usage.completion_tokens >= 1
        assert typed.usage is not None and typed.usage.completion_tokens >= 1
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=90)
    assert process.returncode == 130, (
        stderr
    )  # Ctrl-C: uvicorn shuts down, then the CLI's usual exit
    assert "model loaded" in stderr and "tenant=local" in stderr
    assert SECRET not in stderr  # prompts are not logged


def _health_status(port: int) -> int | None:
    """/health's status, or None while the server is not accepting connections yet."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health").status_code
    except httpx.TransportError:
        return None
