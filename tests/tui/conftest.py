"""Fixtures for the dashboard tests: fixed hardware, an empty Hugging Face cache."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tui_fakes import FakeHardware, cpu_only_machine, gpu_24gb_machine


@pytest.fixture(autouse=True)
def empty_hf_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """The picker and the default model must not see the developer's real downloads."""
    hf_home = tmp_path_factory.mktemp("hf-home")
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield hf_home


@pytest.fixture
def cpu_machine() -> FakeHardware:
    return cpu_only_machine()


@pytest.fixture
def gpu_machine() -> FakeHardware:
    return gpu_24gb_machine()


@pytest.fixture(scope="session")
def lone_demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama demo alone in its folder: the shared demo cache may also hold its
    quantized siblings (other tests make them), which the planner would list as options."""
    from homelab.gguf.demo import demo_model_path

    source = demo_model_path("llama", "tiny")
    target = tmp_path_factory.mktemp("lone-demo") / source.name
    shutil.copyfile(source, target)
    return target
