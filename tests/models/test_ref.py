"""``resolve``: one test per MODEL form, what each plans over and which file it loads."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_hub import FakeHub

from homelab.errors import HomelabError, ModelFileError
from homelab.hub.pull import pull_by_name
from homelab.models.ref import (
    CatalogueModel,
    DemoModel,
    HubModel,
    LocalFile,
    model_stem,
    resolve,
)


def test_a_gguf_path_is_a_local_file_planned_with_its_sibling_quants(
    tmp_path: Path, demo_model: Callable[..., Path]
) -> None:
    for quant in ("F16", "Q8_0", "Q4_K_M"):
        shutil.copy(demo_model("llama", "tiny", quant), tmp_path / f"Tiny-Llama-{quant}.gguf")
    shutil.copy(demo_model("qwen3", "tiny", "Q8_0"), tmp_path / "Other-Model-Q8_0.gguf")
    ref = resolve(str(tmp_path / "Tiny-Llama-Q8_0.gguf"))
    assert isinstance(ref, LocalFile) and ref.label == "Tiny-Llama-Q8_0.gguf"
    assert ref.local_path() == tmp_path / "Tiny-Llama-Q8_0.gguf"
    assert sorted(m.file_type for m in ref.variants()) == ["F16", "Q4_K_M", "Q8_0"]


def test_a_missing_path_fails_at_once() -> None:
    with pytest.raises(ModelFileError, match="file not found"):
        resolve("/nonexistent/model-Q4_K_M.gguf")


@pytest.mark.parametrize(
    ("name", "stem", "quant"),
    [
        ("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "Meta-Llama-3.1-8B-Instruct", "Q4_K_M"),
        ("qwen2.5-7b-instruct-q8_0-00001-of-00002.gguf", "qwen2.5-7b-instruct", "q8_0"),
        ("model.IQ4_XS.gguf", "model", "IQ4_XS"),
        ("gpt-oss-20b-MXFP4.gguf", "gpt-oss-20b", "MXFP4"),
        ("plain.gguf", "plain", None),
    ],
)
def test_model_stem(name: str, stem: str, quant: str | None) -> None:
    assert model_stem(Path(name)) == (stem, quant)


def test_a_demo_name_is_parsed_without_generating_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOMELAB_DEMO_CACHE", str(tmp_path / "demo-cache"))
    ref = resolve("demo:qwen3:tiny:Q8_0")
    assert ref == DemoModel("demo:qwen3:tiny:Q8_0", "qwen3", "tiny", "Q8_0")
    assert not (tmp_path / "demo-cache").exists()  # generated on first use, not on resolve
    with pytest.raises(HomelabError, match="demo model name"):
        resolve("demo:llama:tiny:Q9")


def test_demo_alone_is_the_trained_model_and_random_ones_are_named() -> None:
    """``demo`` is the shipped model that writes words; a random-weight one is named by its
    ARCH or SIZE (``demo:llama``, ``demo:bench``)."""
    from homelab.gguf.demo import trained_model_path

    assert resolve("demo") == DemoModel("demo", "trained", "tiny", "F16")
    assert resolve("demo").local_path() == trained_model_path("F16")
    assert resolve("demo:Q4_K_M").local_path() == trained_model_path("Q4_K_M")
    assert resolve("demo:trained:q4_k_m") == DemoModel(
        "demo:trained:q4_k_m", "trained", "tiny", "Q4_K_M"
    )
    assert resolve("demo:llama") == DemoModel("demo:llama", "llama", "tiny", "F16")
    assert resolve("demo:bench:Q8_0") == DemoModel("demo:bench:Q8_0", "llama", "bench", "Q8_0")
    with pytest.raises(HomelabError, match="comes in F16 and Q4_K_M") as refused:
        resolve("demo:Q8_0")
    assert "demo:llama:Q8_0" in (refused.value.hint or "")
    with pytest.raises(HomelabError, match="demo model name"):
        resolve("demo:Q4_K_M:tiny")


def test_a_demo_model_loads_its_generated_file(demo_model: Callable[..., Path]) -> None:
    ref = resolve("demo:llama")
    assert ref.local_path() == demo_model("llama", "tiny", "F16")
    assert ref.label == "llama tiny demo" and ref.kind == "demo"


def test_a_library_name_is_the_local_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_model: Callable[..., Path]
) -> None:
    monkeypatch.setenv("HOMELAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    folder = tmp_path / "library"
    folder.mkdir()
    shutil.copy(demo_model("llama", "tiny", "Q8_0"), folder / "my-model-Q8_0.gguf")
    monkeypatch.setenv("HOMELAB_MODEL_DIRS", str(folder))
    ref = resolve("my-model-Q8_0")
    assert isinstance(ref, LocalFile) and ref.origin == str(folder)
    assert ref.local_path() == folder / "my-model-Q8_0.gguf"


def test_a_catalogue_name_plans_from_its_shape_and_has_no_file_until_downloaded() -> None:
    ref = resolve("llama3.1:8b")
    assert isinstance(ref, CatalogueModel) and ref.entry.slug == "llama-3.1-8b"
    assert not ref.on_disk
    variants = ref.variants()
    assert len(variants) >= 3 and all(m.architecture == "llama" for m in variants)
    with pytest.raises(ModelFileError, match="not downloaded yet") as caught:
        ref.local_path()
    assert "homelab run llama3.1:8b --yes" in str(caught.value)
    assert ref.entry.hf_repo in str(caught.value)


def test_an_unknown_name_lists_the_forms_and_the_catalogue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelFileError, match="no such model") as caught:
        resolve("surely-not-a-model")
    message = str(caught.value)
    assert "surely-not-a-model" in message and "llama-3.1-8b" in message
    assert "demo[:ARCH]" in message and "ORG/NAME[:QUANT]" in message


def test_a_hub_file_not_downloaded_plans_remotely_and_says_how_to_get_it(
    hub_repo: str, fake_hub: FakeHub
) -> None:
    ref = resolve(f"{hub_repo}:Q4_0")
    assert ref == HubModel(f"{hub_repo}:Q4_0", hub_repo, "Q4_0", None, ())
    assert fake_hub.requests() == []  # resolving reads the disk only
    with pytest.raises(ModelFileError, match="not downloaded yet") as caught:
        ref.local_path()
    assert f"homelab pull {hub_repo}:Q4_0" in str(caught.value)
    (remote,) = ref.variants()  # the header, read remotely
    assert remote.file_type == "Q4_0" and not Path(remote.source).exists()
    every = resolve(hub_repo).variants()
    assert sorted(m.file_type for m in every) == ["F16", "Q4_0"]


def test_a_downloaded_hub_file_is_the_cached_file(hub_repo: str) -> None:
    pulled = pull_by_name(f"{hub_repo}:Q4_0")
    ref = resolve(f"{hub_repo}:q4_0")
    assert isinstance(ref, HubModel) and ref.local_path() == pulled.path
    assert ref.origin == f"hf · {hub_repo}"
    assert resolve(hub_repo).local_path() == pulled.path  # the one downloaded quant
    pull_by_name(f"{hub_repo}:F16")
    with pytest.raises(ModelFileError, match="several quants are downloaded"):
        resolve(hub_repo).local_path()
