"""Model names to quant variants, and sizes as people type them."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from homelab.errors import ModelFileError, PlanError
from homelab.planner.resolve import model_stem, resolve_model
from homelab.units import format_size, parse_size


def test_local_quant_files_of_one_model_are_its_variants(
    tmp_path: Path, demo_model: Callable[..., Path]
) -> None:
    for quant in ("F16", "Q8_0", "Q4_K_M"):
        shutil.copy(demo_model("llama", "tiny", quant), tmp_path / f"Tiny-Llama-{quant}.gguf")
    shutil.copy(demo_model("qwen3", "tiny", "Q8_0"), tmp_path / "Other-Model-Q8_0.gguf")
    variants = resolve_model(str(tmp_path / "Tiny-Llama-Q8_0.gguf"))
    assert sorted(m.file_type for m in variants) == ["F16", "Q4_K_M", "Q8_0"]
    only = resolve_model(str(tmp_path / "Tiny-Llama-Q8_0.gguf"), quant="Q4_K_M")
    assert [m.file_type for m in only] == ["Q4_K_M"]
    with pytest.raises(PlanError, match="Found"):
        resolve_model(str(tmp_path / "Tiny-Llama-Q8_0.gguf"), quant="Q6_K")


def test_a_plan_for_a_local_file_chooses_among_its_siblings(
    tmp_path: Path, demo_model: Callable[..., Path]
) -> None:
    from planner_helpers import cpu_hardware

    from homelab.planner.plan import plan_model

    for quant in ("F16", "Q8_0"):
        shutil.copy(demo_model("llama", "tiny", quant), tmp_path / f"Tiny-{quant}.gguf")
    result = plan_model(str(tmp_path / "Tiny-Q8_0.gguf"), cpu_hardware(4), verify=False)
    assert result.settings.quant == "F16"  # the better sibling fits too
    assert result.quants_considered == ("F16", "Q8_0")


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


def test_catalogue_names_and_missing_files() -> None:
    variants = resolve_model("llama3.1:8b")
    assert len(variants) >= 3 and all(m.architecture == "llama" for m in variants)
    assert [m.file_type for m in resolve_model("llama-3.1-8b", "Q4_K_M")] == ["Q4_K_M"]
    with pytest.raises(ModelFileError, match="not found"):
        resolve_model("/nonexistent/model-Q4_K_M.gguf")
    with pytest.raises(PlanError, match="catalogue"):
        resolve_model("surely-not-a-model")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("24GiB", 24 << 30), ("512MiB", 512 << 20), ("24GB", 24 * 10**9), ("1.5G", 3 << 29),
     ("1073741824", 1 << 30), (" 8 gib ", 8 << 30)],
)  # fmt: skip
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "12 parsecs", "-1GiB"])
def test_parse_size_rejects_nonsense(text: str) -> None:
    with pytest.raises(PlanError):
        parse_size(text)


def test_format_size() -> None:
    assert format_size(3 << 29) == "1.50 GiB"
    assert format_size(512 << 20) == "512.00 MiB"
    assert format_size(100) == "100 B"
