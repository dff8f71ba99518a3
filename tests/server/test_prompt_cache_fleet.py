"""The fleet and the prompt cache: a model unloaded (as an eviction does: its engine closes)
and loaded again finds its tenants' prefixes; the cache's RAM is set aside before planning."""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from homelab.cli import build_parser
from homelab.cli.serve import build_fleet
from homelab.engine.prompt_cache.store import CacheConfig, PromptCache
from homelab.planner.budget import resolve_hardware
from homelab.server.config import ServerConfig
from homelab.server.runner import start_server
from homelab.units import GIB, MIB

MODEL = "homelab-demo-llama-tiny-v2:F16"


def test_an_unloaded_model_finds_its_prefixes_when_loaded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_model: Callable[..., Path]
) -> None:
    library = tmp_path / "library"
    library.mkdir()
    shutil.copy(demo_model("llama"), library)
    monkeypatch.setenv("HOMELAB_MODEL_DIRS", str(library))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hf-cache"))
    cache = PromptCache(CacheConfig(64 * MIB, 64 * MIB, tmp_path / "states", min_tokens=32))
    argv = ["serve", "--ram", str(8 * GIB), "--ctx", "1024", "--parallel", "1"]
    fleet = build_fleet(build_parser(only="serve").parse_args(argv), cache)
    whole = resolve_hardware(ram_bytes=8 * GIB).cpu.budget_bytes
    assert fleet.hardware.cpu.budget_bytes == whole - 64 * MIB  # set aside before planning
    config = ServerConfig(default_max_tokens=4)
    handle = start_server(None, config=config, fleet=fleet, prompt_cache=cache)
    prompt = [300 + secrets.randbelow(700) for _ in range(200)]
    try:
        with httpx.Client(base_url=handle.url, timeout=120) as http:
            assert complete(http, prompt)["cached"] == 0
            unloaded = http.post("/admin/models/unload", json={"model": MODEL})
            assert unloaded.status_code == 200 and unloaded.json()["unloaded"]
            usage = complete(http, prompt)  # loads the model again
            assert usage["cached"] == usage["prompt"] - 1
            metrics = http.get("/metrics").text
            assert 'homelab_prompt_cache_hits_total{tier="ram"} 1' in metrics
    finally:
        handle.stop()
        fleet.close()
        cache.close()


def complete(http: httpx.Client, prompt: list[int]) -> dict[str, int]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    return {
        "prompt": usage["prompt_tokens"],
        "cached": usage["prompt_tokens_details"]["cached_tokens"],
    }
