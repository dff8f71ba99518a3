"""``homelab run MODEL --image PATH``: a generated vision model (its mmproj found beside it)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from homelab.cli import main

RUN = ["--prompt", "what is it", "--max-tokens", "3", "--temperature", "0", "--threads", "1"]


@pytest.fixture
def image_file(tmp_path: Path) -> Path:
    path = tmp_path / "picture.png"
    pixels = np.random.default_rng(0).integers(0, 256, (90, 120, 3), dtype=np.uint8)
    Image.fromarray(pixels, "RGB").save(path)
    return path


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["run", *argv, *RUN, "--ctx", "512", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_an_image_costs_its_tokens(capsys: pytest.CaptureFixture[str], image_file: Path) -> None:
    with_image = run_json(capsys, "demo:vision-qwen2vl", "--image", str(image_file))
    text_only = run_json(capsys, "demo:vision-qwen2vl")
    image_tokens = 4 * 3  # 120x90 px -> 112x84: one token per 28x28
    extra = with_image["stats"]["prompt_tokens"] - text_only["stats"]["prompt_tokens"]  # type: ignore[index]
    assert extra >= image_tokens and with_image["finish_reason"] == "length"


def test_a_text_only_model_refuses_the_image(
    capsys: pytest.CaptureFixture[str], image_file: Path
) -> None:
    code = main(["run", "demo:llama", "--image", str(image_file), *RUN, "--ctx", "256"])
    assert code != 0
    assert "takes no images" in capsys.readouterr().err


def test_an_unreadable_image_is_refused_before_loading(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fake = tmp_path / "fake.png"
    fake.write_bytes(b"not a picture")
    assert main(["run", "demo:vision-gemma3", "--image", str(fake), *RUN]) != 0
    assert "image" in capsys.readouterr().err.lower()
