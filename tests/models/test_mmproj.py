"""Which vision projector goes with a model: found beside it by llama.cpp's naming, given with
``--mmproj``, skipped with ``--no-mmproj``; checked to be a projector of the model's width.

Real GGUF files throughout: the generated demo vision models (``homelab.gguf.demo_vision``)
copied under the names users' folders and Hugging Face repos give them.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from fake_hub import FakeHub

from homelab.errors import ModelFileError
from homelab.gguf import demo_vision
from homelab.gguf.model import ModelInfo
from homelab.gguf.projector import check_pair, read_projector
from homelab.gguf.reader import read_header_file, read_model
from homelab.models.mmproj import choose_mmproj, find_mmproj, projector_for, with_projector
from homelab.models.ref import HubModel
from homelab.planner.search import PlanRequest


@pytest.fixture(scope="module")
def pair() -> tuple[Path, Path]:
    """(the gemma3 demo text model, its projector)."""
    return demo_vision.text_model_path("gemma3"), demo_vision.mmproj_path("gemma3")


def _folder(tmp_path: Path, pair: tuple[Path, Path], names: dict[str, str]) -> Path:
    """A folder with the text model as ``Gemma-Q4_K_M.gguf`` and projectors named ``names``
    (name -> "gemma3" for the real projector, "text" for the text model's own bytes)."""
    text, projector = pair
    model = tmp_path / "Gemma-Q4_K_M.gguf"
    shutil.copy(text, model)
    for name, what in names.items():
        shutil.copy(projector if what == "gemma3" else text, tmp_path / name)
    return model


def test_naming_prefers_the_models_name_then_its_quant_then_f16() -> None:
    model = Path("/m/Qwen2.5-VL-7B-Q4_K_M.gguf")
    names = [
        "mmproj-other-F16.gguf",
        "mmproj-Qwen2.5-VL-7B-F32.gguf",
        "mmproj-Qwen2.5-VL-7B-F16.gguf",
        "Qwen2.5-VL-7B-mmproj-BF16.gguf",
    ]
    assert choose_mmproj(model, [Path("/m") / n for n in names]) == Path(
        "/m/mmproj-Qwen2.5-VL-7B-F16.gguf"
    )
    unnamed = [Path("/m/mmproj-F32.gguf"), Path("/m/mmproj-BF16.gguf"), Path("/m/mmproj-F16.gguf")]
    assert choose_mmproj(model, unnamed) == Path("/m/mmproj-F16.gguf")
    same_quant = [
        Path("/m/mmproj-Qwen2.5-VL-7B-F16.gguf"),
        Path("/m/mmproj-Qwen2.5-VL-7B-Q4_K_M.gguf"),
    ]
    assert choose_mmproj(model, same_quant) == same_quant[1]
    assert choose_mmproj(model, []) is None


def test_the_projector_beside_the_model_is_found_and_checked(
    tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    model = _folder(
        tmp_path, pair, {"mmproj-Gemma-F16.gguf": "gemma3", "mmproj-Gemma-F32.gguf": "gemma3"}
    )
    info = read_model(model)
    found = projector_for(info)
    assert found is not None and Path(found.path).name == "mmproj-Gemma-F16.gguf"
    assert (found.projector_type, found.n_embd_out) == ("gemma3", info.n_embd)
    assert projector_for(info, skip=True) is None
    given = projector_for(info, tmp_path / "mmproj-Gemma-F32.gguf")
    assert given is not None and given.path.endswith("F32.gguf")


def test_a_text_model_alone_has_no_projector(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    info = read_model(_folder(tmp_path, pair, {}))
    assert find_mmproj(Path(info.source)) is None and projector_for(info) is None
    assert with_projector(PlanRequest(), info).projector is None


def test_a_projector_of_another_width_is_refused_when_it_is_the_models_own(
    tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    info = read_model(_folder(tmp_path, pair, {"mmproj-Gemma-F16.gguf": "gemma3"}))
    wider: ModelInfo = replace(info, n_embd=info.n_embd * 2)
    with pytest.raises(ModelFileError, match="belongs to another model"):
        projector_for(wider)
    with pytest.raises(ModelFileError, match="belongs to another model"):
        projector_for(wider, tmp_path / "mmproj-Gemma-F16.gguf")


def test_an_unnamed_projector_of_another_model_in_a_shared_folder_is_left_alone(
    tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    info = read_model(_folder(tmp_path, pair, {"mmproj-F16.gguf": "gemma3"}))
    assert projector_for(info) is not None  # the only one, and it fits
    assert projector_for(replace(info, n_embd=info.n_embd * 2)) is None


def test_a_file_that_is_not_a_projector(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    """Given: a clear error. Beside the model (a broken download): skipped."""
    model = _folder(tmp_path, pair, {"mmproj-Gemma-F16.gguf": "text"})
    info = read_model(model)
    with pytest.raises(ModelFileError, match="not a vision projector"):
        projector_for(info, tmp_path / "mmproj-Gemma-F16.gguf")
    (tmp_path / "mmproj-Gemma-Q8_0.gguf").write_bytes(b"GGUF-not-really")
    assert projector_for(info) is None


def test_projector_arithmetic_from_the_header(pair: tuple[Path, Path]) -> None:
    gemma = read_projector(pair[1])
    assert gemma.fixed_image_tokens == demo_vision.fixed_image_tokens("gemma3")
    assert gemma.max_image_tokens(custom_max=10) == gemma.fixed_image_tokens  # fixed: no say
    qwen = read_projector(demo_vision.mmproj_path("qwen2vl"))
    assert (qwen.projector_type, qwen.fixed_image_tokens) == ("qwen2vl_merger", None)
    assert qwen.max_image_tokens() == 4096 and qwen.max_image_tokens(1024) == 1024
    header = read_header_file(demo_vision.mmproj_path("qwen2vl"))
    assert qwen.weights_bytes == sum(t.n_bytes for t in header.tensors) > 0
    check_pair(qwen, 256, "m")
    with pytest.raises(ModelFileError, match="audio-only"):
        check_pair(replace(qwen, has_vision=False), 256, "m")


def test_a_download_offer_plans_the_projector_the_pull_would_fetch(
    hub_env: Path, own_home: Path, fake_hub: FakeHub
) -> None:
    """Before anything is downloaded, the offer's plan (from remote headers) counts the
    projector the repo offers; ``--no-mmproj`` leaves it out. (The hub is the fake hub.)"""
    from homelab.models.fetch import plan_download
    from homelab.models.ref import resolve
    from homelab.planner.budget import resolve_hardware

    projector = demo_vision.mmproj_path("gemma3")
    fake_hub.add_repo(
        "homelab-test/Eyes-GGUF",
        {"Eyes-F16.gguf": demo_vision.text_model_path("gemma3"), "mmproj-F16.gguf": projector},
    )
    ref = resolve("homelab-test/Eyes-GGUF:F16")
    assert isinstance(ref, HubModel) and not ref.on_disk
    offer = plan_download(ref, PlanRequest(ctx=1024), resolve_hardware())
    assert offer.plan is not None and offer.plan.projector is not None
    assert offer.plan.projector.weights_bytes == read_projector(projector).weights_bytes
    assert offer.plan.projector.compute_source == "estimated"  # nothing local to measure
    bare = plan_download(ref, PlanRequest(ctx=1024, no_mmproj=True), resolve_hardware())
    assert bare.plan is not None and bare.plan.projector is None
