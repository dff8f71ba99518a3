"""The mtmd doorway on the generated vision models (real libmtmd, random weights)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from homelab.errors import EngineClosedError, EngineError, ModelFileError
from homelab.gguf import demo_vision
from homelab.images.decoded import DecodedImage
from homelab.llamacpp.model import Model, ModelParams
from homelab.llamacpp.mtmd import Projector, ProjectorLoadError, ProjectorParams

CPU = ProjectorParams(use_gpu=False, n_threads=1)


def picture(width_px: int, height_px: int) -> DecodedImage:
    pixels = np.full(width_px * height_px * 3, 128, dtype=np.uint8)
    return DecodedImage(pixels.tobytes(), width_px, height_px)


@pytest.fixture(scope="module")
def models() -> Iterator[dict[str, Model]]:
    loaded = {
        kind: Model.load(demo_vision.text_model_path(kind), ModelParams(n_gpu_layers=0))
        for kind in demo_vision.VISION_KINDS
    }
    yield loaded
    for model in loaded.values():
        model.close()


def image_chunk_counts(projector: Projector, image: DecodedImage) -> tuple[int, int]:
    chunks = projector.tokenize(f"look {projector.marker} here", [image])
    (chunk,) = [chunk for chunk in chunks if chunk.image_index == 0]
    return chunk.n_tokens, chunk.n_pos


def test_gemma3_takes_a_fixed_number_of_tokens_per_image(models: dict[str, Model]) -> None:
    with Projector.load(demo_vision.mmproj_path("gemma3"), models["gemma3"], CPU) as projector:
        assert (projector.uses_mrope, projector.non_causal) == (False, True)
        fixed = demo_vision.fixed_image_tokens("gemma3")
        for size in ((32, 32), (640, 120), (97, 401)):
            assert image_chunk_counts(projector, picture(*size)) == (fixed, fixed)


def test_qwen2vl_tokens_follow_the_image_size(models: dict[str, Model]) -> None:
    with Projector.load(demo_vision.mmproj_path("qwen2vl"), models["qwen2vl"], CPU) as projector:
        assert (projector.uses_mrope, projector.non_causal) == (True, False)
        assert image_chunk_counts(projector, picture(280, 140)) == (10 * 5, 10)
        assert image_chunk_counts(projector, picture(560, 560)) == (20 * 20, 20)
        assert image_chunk_counts(projector, picture(28, 28)) == (9, 3)  # at least 8 tokens


def test_encode_gives_one_row_per_token_with_positions(models: dict[str, Model]) -> None:
    with Projector.load(demo_vision.mmproj_path("qwen2vl"), models["qwen2vl"], CPU) as projector:
        encoded = projector.encode(picture(84, 56))
        n_tokens, n_pos = image_chunk_counts(projector, picture(84, 56))
        assert encoded.embeddings.shape == (n_tokens, projector.n_embd)
        assert encoded.n_pos == n_pos
        t, y, x, _ = encoded.relative_positions
        assert set(t) == {0} and max(y) + 1 == n_tokens // n_pos and max(x) + 1 == n_pos
        assert np.isfinite(encoded.embeddings).all()


def test_markers_must_match_the_images(models: dict[str, Model]) -> None:
    projector = Projector.load(demo_vision.mmproj_path("gemma3"), models["gemma3"], CPU)
    with projector, pytest.raises(EngineError, match="marks 0 image"):
        projector.tokenize("no marker", [picture(8, 8)])


def test_a_projector_for_another_width_is_refused_with_mtmds_reason(
    demo_model: Callable[..., Path],
) -> None:
    """The bench llama is 768 wide, the projector writes 256: mtmd says so, homelab too."""
    wide = Model.load(demo_model("llama", "bench"), ModelParams(n_gpu_layers=0, allocate=False))
    with wide, pytest.raises(ProjectorLoadError, match="mismatch"):
        Projector.load(demo_vision.mmproj_path("gemma3"), wide, CPU)


def test_a_missing_projector_file_says_so(models: dict[str, Model]) -> None:
    with pytest.raises(ModelFileError, match="vision projector not found"):
        Projector.load("/nonexistent/mmproj.gguf", models["gemma3"], CPU)


def test_image_max_tokens_caps_a_dynamic_projector(models: dict[str, Model]) -> None:
    capped = ProjectorParams(use_gpu=False, n_threads=1, image_max_tokens=16)
    with Projector.load(demo_vision.mmproj_path("qwen2vl"), models["qwen2vl"], capped) as projector:
        n_tokens, _ = image_chunk_counts(projector, picture(560, 560))
        assert 8 <= n_tokens <= 16


def test_a_closed_projector_refuses_instead_of_crashing(models: dict[str, Model]) -> None:
    projector = Projector.load(demo_vision.mmproj_path("gemma3"), models["gemma3"], CPU)
    projector.close()
    projector.close()  # idempotent
    with pytest.raises(EngineClosedError):
        projector.tokenize(projector.marker, [picture(8, 8)])
    with pytest.raises(EngineClosedError):
        projector.encode(picture(8, 8))
