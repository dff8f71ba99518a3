"""A hub repo the FakeHub serves (the tiny demo llama in two quants), a catalogue entry's repo
served the same way, and a home of our own: the Hugging Face cache (``hub_env``), calibration
records and library folders stay per test."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fake_hub import FakeHub

REPO = "homelab-test/Tiny-GGUF"


@pytest.fixture
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("HOMELAB_HOME", str(home))
    monkeypatch.delenv("HOMELAB_MODEL_DIRS", raising=False)
    return home


@pytest.fixture
def hub_repo(
    hub_env: Path, own_home: Path, fake_hub: FakeHub, demo_model: Callable[..., Path]
) -> str:
    """``homelab-test/Tiny-GGUF`` with an F16 and a Q4_0 file, nothing downloaded yet."""
    files: dict[str, bytes | Path] = {
        "README.md": b"# Tiny GGUF\n",
        "Tiny-F16.gguf": demo_model("llama", "tiny", "F16"),
        "Tiny-Q4_0.gguf": demo_model("llama", "tiny", "Q4_0"),
    }
    fake_hub.add_repo(REPO, files)
    return REPO


@pytest.fixture
def catalogue_repo(
    hub_env: Path, own_home: Path, fake_hub: FakeHub, demo_model: Callable[..., Path]
) -> str:
    """The hub repo of catalogue entry ``llama-3.1-8b`` (the real hub cannot be reached from
    the test machines): every quant file the catalogue lists, each holding the tiny demo
    llama at Q4_0, nothing downloaded yet."""
    from homelab.gguf.catalogue import find_model

    entry = find_model("llama-3.1-8b")
    weights = demo_model("llama", "tiny", "Q4_0").read_bytes()
    fake_hub.add_repo(
        entry.hf_repo, {"README.md": b"# GGUF\n", **{q.file: weights for q in entry.quants}}
    )
    return entry.hf_repo
