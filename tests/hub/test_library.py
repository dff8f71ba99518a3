"""The local library: library folders + Hugging Face cache, read by their headers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from homelab.hub.library import default_library_dir, find_local, list_local_models
from homelab.hub.pull import pull
from homelab.hub.quants import ModelRef


@pytest.fixture
def library(
    tmp_path: Path,
    quant_files: dict[str, Path],
    split_files: list[Path],
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """A user folder with a file, a renamed file, a split set, a projector and junk."""
    folder = tmp_path / "my-models"
    (folder / "nested").mkdir(parents=True)
    shutil.copy(quant_files["Q8_0"], folder / "tiny-Q8_0.gguf")
    shutil.copy(quant_files["Q4_0"], folder / "nested" / "renamed.gguf")  # the header knows
    for part in split_files:
        shutil.copy(part, folder / part.name)
    (folder / "mmproj-tiny-F16.gguf").write_bytes(b"GGUF")
    (folder / "broken-Q6_K.gguf").write_bytes(quant_files["F16"].read_bytes()[:4096])
    monkeypatch.setenv("HOMELAB_MODEL_DIRS", str(folder))
    return folder


def test_lists_library_folders_and_the_hf_cache(
    hub_env: Path, tiny_repo: str, library: Path
) -> None:
    pull(ModelRef(tiny_repo, "Q4_0"))
    models = {m.path.name: m for m in list_local_models()}
    assert set(models) == {
        "tiny-Q8_0.gguf",
        "renamed.gguf",
        "TinyLlama-Q8_0-00001-of-00002.gguf",
        "broken-Q6_K.gguf",
        "TinyLlama-Q4_0.gguf",
    }
    assert models["renamed.gguf"].quant == "Q4_0" and models["renamed.gguf"].info is not None
    split = models["TinyLlama-Q8_0-00001-of-00002.gguf"]
    assert split.info is not None and split.info.n_files == 2
    assert split.size_bytes == split.info.file_bytes
    broken = models["broken-Q6_K.gguf"]
    assert broken.info is None and "truncated" in (broken.problem or "")
    assert broken.quant == "Q6_K"  # from the name, since the header is unreadable
    hub_file = models["TinyLlama-Q4_0.gguf"]
    assert hub_file.repo_id == tiny_repo and hub_file.ref == f"{tiny_repo}:Q4_0"


def test_find_local_by_path_repo_or_name(hub_env: Path, tiny_repo: str, library: Path) -> None:
    pulled = pull(ModelRef(tiny_repo, "Q4_0"))
    assert find_local(f"{tiny_repo}:Q4_0").path == pulled.path  # type: ignore[union-attr]
    assert find_local(tiny_repo).path == pulled.path  # type: ignore[union-attr]
    assert find_local("tiny-Q8_0").path == library / "tiny-Q8_0.gguf"  # type: ignore[union-attr]
    assert find_local(str(library / "nested" / "renamed.gguf")) is not None
    assert find_local("no-such-model") is None


def test_default_library_folder_is_under_the_data_dir(hub_env: Path) -> None:
    assert default_library_dir().name == "models"
    assert list_local_models(include_hf_cache=False) == []  # nothing there yet
