"""Fixtures shared by every test package.

- Every test session gets its own ``HOMELAB_HOME`` (config, data, caches) in a temp dir, so
  tests never read or write the developer's real settings, and an empty Hugging Face cache
  (``HF_HOME``) so the developer's downloaded models never change what a test sees.
- Generated demo models are the exception: they take seconds to build and never change for
  a given generator version, so they live in ``HOMELAB_DEMO_CACHE`` (default
  ``~/.cache/homelab-test-models``) and are reused across runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# the FakeHub (tests/hub, models, tui) and the repos it serves (tests/hub, tests/cli)
pytest_plugins = ["fake_hub_fixtures", "hub_repo_fixtures"]

DEFAULT_TEST_DEMO_CACHE = Path("~/.cache/homelab-test-models").expanduser()


@pytest.fixture(autouse=True, scope="session")
def homelab_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh HOMELAB_HOME for the session; demo models stay in the persistent cache."""
    home = tmp_path_factory.mktemp("homelab-home")
    patch = pytest.MonkeyPatch()
    patch.setenv("HOMELAB_HOME", str(home))
    # the user's own models must not leak into tests: an empty Hugging Face cache, no extra
    # library folders (tests that need either set them up themselves)
    patch.setenv("HF_HOME", str(home / "hf"))
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HOMELAB_MODEL_DIRS"):
        patch.delenv(name, raising=False)
    patch.setenv(
        "HOMELAB_DEMO_CACHE", os.environ.get("HOMELAB_DEMO_CACHE") or str(DEFAULT_TEST_DEMO_CACHE)
    )
    yield home
    patch.undo()


DemoModelFactory = Callable[..., Path]


@pytest.fixture(scope="session")
def demo_model() -> DemoModelFactory:
    """``demo_model(arch, size="tiny", quant="F16") -> Path``: a generated, cached GGUF.

    The weights are random: the model loads and generates, but its text means nothing.
    """
    from homelab.gguf.demo import demo_model_path

    def make(arch: str = "llama", size: str = "tiny", quant: str = "F16") -> Path:
        return demo_model_path(arch, size, quant)

    return make


@pytest.fixture(scope="session")
def byte_vocab_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo llama with a vocabulary of byte tokens only (no pieces, not even ``▁``).

    Every character falls back to its UTF-8 bytes and every space becomes ``▁``'s three
    bytes, so a text has more tokens than bytes — legal, and what a buffer sized from the
    text's length cannot hold.
    """
    from homelab.gguf import generator, vocab

    full_vocabulary = vocab.build_vocabulary

    def bytes_only(n_vocab: int, *args: Any, **kwargs: Any) -> vocab.Vocabulary:
        full = full_vocabulary(n_vocab, *args, **kwargs)
        kept = len(vocab.SPECIALS) + 256
        filler = n_vocab - kept
        return vocab.Vocabulary(
            full.tokens[:kept] + tuple(f"<unused{i}>" for i in range(filler)),
            full.scores[:kept] + (-1e9,) * filler,
            full.types[:kept] + (vocab.USER_DEFINED,) * filler,
        )

    path = tmp_path_factory.mktemp("byte-vocab") / "homelab-demo-llama-bytes-F16.gguf"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vocab, "build_vocabulary", bytes_only)
        return generator.write_spec_model(path, generator.spec_for("llama", "tiny"), "llama-bytes")
