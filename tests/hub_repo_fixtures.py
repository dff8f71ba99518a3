"""The repos the FakeHub serves to the hub's tests and the hub verbs' (tests/hub, tests/cli):
generated GGUF files. Registered as a plugin in ``tests/conftest.py``. The FakeHub itself and
the environment pointing at it (``fake_hub``, ``hub_env``) are in
``tests/fake_hub_fixtures.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import pytest
from fake_hub import FakeHub

REPO = "homelab-test/TinyLlama-GGUF"
QUANTS = ("F16", "Q8_0", "Q4_0")


@pytest.fixture(scope="session")
def quant_files(demo_model: Callable[..., Path]) -> dict[str, Path]:
    """The tiny demo llama in three quants, standing in for a repo's files."""
    return {quant: demo_model("llama", "tiny", quant) for quant in QUANTS}


@pytest.fixture(scope="session")
def split_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The tiny demo llama as a two-part Q8_0 split set: written in F16 parts with the gguf
    package (as gguf-split would), then quantized by llama.cpp keeping the split."""
    from homelab.gguf import generator
    from homelab.llamacpp.quantize import quantize_gguf

    folder = tmp_path_factory.mktemp("split")
    spec = generator.spec_for("llama", "tiny")
    tensors = list(generator.random_tensors(spec, seed=0))
    writer = gguf.GGUFWriter(
        folder / "TinyLlama-F16.gguf", spec.arch, split_max_tensors=len(tensors) // 2 + 1
    )
    generator.write_hparams(writer, spec, "homelab-demo-llama-tiny")
    generator.write_tokenizer(writer, spec.n_vocab)
    for name, data in tensors:
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    quantize_gguf(
        folder / "TinyLlama-F16-00001-of-00002.gguf",
        folder / "TinyLlama-Q8_0",
        "Q8_0",
        keep_split=True,
    )
    parts = sorted(folder.glob("TinyLlama-Q8_0-*-of-*.gguf"))
    assert len(parts) == 2, parts
    return parts


@pytest.fixture
def tiny_repo(fake_hub: FakeHub, quant_files: dict[str, Path], split_files: list[Path]) -> str:
    """A repo with F16, Q8_0 (as a split set) and Q4_0 files, plus a README and a projector."""
    files: dict[str, bytes | Path] = {
        "README.md": b"# TinyLlama GGUF\n",
        "TinyLlama-F16.gguf": quant_files["F16"],
        "TinyLlama-Q4_0.gguf": quant_files["Q4_0"],
        "mmproj-TinyLlama-F16.gguf": b"GGUF-not-really",
    }
    files.update({f"Q8_0/{part.name}": part for part in split_files})
    fake_hub.add_repo(REPO, files, downloads=1234, likes=56)
    fake_hub.add_repo(
        "homelab-test/Other-GGUF", {"Other-Q8_0.gguf": quant_files["Q8_0"]}, downloads=10, likes=1
    )
    return REPO


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP port that accepts connections and never answers: a stalled hub or CDN."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()
