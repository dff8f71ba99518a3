"""``homelab quantize``: llama.cpp's quantizer on a generated F16 model, with provenance."""

from __future__ import annotations

import json
import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from homelab.errors import ModelFileError
from homelab.gguf.quantize import provenance_path, read_provenance
from homelab.gguf.reader import read_model
from homelab.hub.library import list_local_models
from homelab.hub.local_quantize import default_target, quantize_model, quantize_suggestion
from homelab.llamacpp.model import Model, ModelLoadError


@pytest.fixture
def f16_source(tmp_path: Path, quant_files: dict[str, Path]) -> Path:
    source = tmp_path / "lib" / "TinyLlama-F16.gguf"
    source.parent.mkdir()
    shutil.copy(quant_files["F16"], source)
    return source


def _loads_in_llama_cpp(path: Path) -> bool:
    try:
        with Model.load(path) as model:
            return model.n_params > 0
    except ModelLoadError:
        return False


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K", "Q5_K_M", "Q6_K", "IQ4_XS"])
def test_quantize_f16_writes_a_loadable_smaller_file_with_provenance(
    f16_source: Path, quant: str
) -> None:
    before = f16_source.read_bytes()
    progress: list[tuple[int, int]] = []
    record = quantize_model(str(f16_source), quant, progress=lambda d, t: progress.append((d, t)))
    target = Path(record.target)
    expected_label = "Q4_K_M" if quant == "Q4_K" else quant
    assert target == f16_source.parent / f"TinyLlama-{expected_label}.gguf"
    assert f16_source.read_bytes() == before  # the source is untouched
    model = read_model(target)
    assert model.file_type == expected_label
    assert record.target_bytes == target.stat().st_size < len(before)
    assert _loads_in_llama_cpp(target)
    assert progress and progress[-1][0] == progress[-1][1] == len(model.tensors)
    assert read_provenance(target) == record
    document = json.loads(provenance_path(target).read_text())
    assert document["source"] == str(f16_source.resolve()) and document["source_file_type"] == "F16"
    assert not document["requantized"]
    listed = {m.path: m for m in list_local_models([f16_source.parent], include_hf_cache=False)}
    assert listed[target].provenance == record


def test_quantize_refuses_to_overwrite(f16_source: Path) -> None:
    existing = f16_source.parent / "TinyLlama-Q8_0.gguf"
    existing.write_bytes(b"mine")
    with pytest.raises(ModelFileError, match="already exists"):
        quantize_model(str(f16_source), "Q8_0")
    assert existing.read_bytes() == b"mine"
    with pytest.raises(ModelFileError, match="overwrite the source"):
        quantize_model(str(f16_source), "Q8_0", output=f16_source)


def test_quantize_refuses_a_target_that_is_not_smaller(
    tmp_path: Path, quant_files: dict[str, Path]
) -> None:
    with pytest.raises(ModelFileError, match="would not be smaller"):
        quantize_model(str(quant_files["Q4_0"]), "Q8_0", output=tmp_path / "x.gguf")


def test_quantize_checks_free_disk_first(f16_source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    usage = namedtuple("usage", "total used free")
    # A fake full disk: filling the real one is not something a test may do.
    fake_disk_usage = lambda _: usage(10, 10, 1000)  # noqa: E731
    monkeypatch.setattr("homelab.gguf.quantize.shutil.disk_usage", fake_disk_usage)
    with pytest.raises(ModelFileError, match="not enough free disk"):
        quantize_model(str(f16_source), "Q4_K_M")
    assert [p.name for p in f16_source.parent.iterdir()] == [f16_source.name]


def test_quantize_from_q8_0_is_recorded_as_requantized(f16_source: Path) -> None:
    q8 = Path(quantize_model(str(f16_source), "Q8_0").target)
    record = quantize_model(str(q8), "Q4_0")
    assert record.requantized and record.source_file_type == "Q8_0"
    assert _loads_in_llama_cpp(Path(record.target))


def test_suggestion_and_default_target_for_hub_files(f16_source: Path) -> None:
    model = read_model(f16_source)
    assert quantize_suggestion(model) == f"homelab quantize {f16_source} --to Q4_K_M"
    from homelab.hub.library import describe

    local = describe(f16_source, "hf · org/m", repo_id="org/m")
    assert default_target(local, "IQ4_XS").name == "TinyLlama-IQ4_XS.gguf"
    assert default_target(local, "IQ4_XS").parent.name == "models"  # not the HF cache
