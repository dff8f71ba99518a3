"""``homelab prompt-cache``: list, size and clear the saved prompt states, per tenant and per model.
The states are plain bytes written by the store (the CLI never interprets them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from homelab.cli import main
from homelab.cli.prompt_cache import cache_folder
from homelab.engine.prompt_cache.key import ModelKey
from homelab.engine.prompt_cache.store import CacheConfig, PromptCache
from homelab.gguf.identity import model_identity

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
