"""The generated vision pairs: names, files, caching and ``homelab demo-model --vision``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from homelab import cli
from homelab.errors import HomelabError
from homelab.gguf import demo_vision
from homelab.gguf.demo import demo_ref_path, parse_demo_ref
from homelab.gguf.reader import read_model


@pytest.mark.parametrize("kind", demo_vision.VISION_KINDS)
def test_each_pair_is_a_text_model_and_its_projector_side_by_side(kind: str) -> None:
    text = demo_ref_path(f"demo:vision-{kind}")
    projector = demo_vision.mmproj_path(kind)
    assert projector.parent == text.parent and projector.name.startswith("mmproj-")
    assert sorted(p.name for p in text.parent.glob("mmproj*.gguf")) == [projector.name]
    info = read_model(text)
    assert info.architecture == ("gemma3" if kind == "gemma3" else "qwen2vl")
    assert info.n_embd == demo_vision.text_spec(kind).n_embd
    assert projector.stat().st_size < 2_000_000  # tiny: loads in milliseconds


def test_files_are_made_once_and_reused() -> None:
    path = demo_vision.mmproj_path("gemma3")
    stamp = path.stat().st_mtime_ns
    assert demo_vision.mmproj_path("gemma3").stat().st_mtime_ns == stamp


def test_names_and_their_refusals() -> None:
    assert parse_demo_ref("demo:vision-qwen2vl") == ("vision-qwen2vl", "tiny", "F16")
    with pytest.raises(HomelabError, match="F16 only"):
        demo_ref_path("demo:vision-gemma3:tiny:Q8_0")
    with pytest.raises(HomelabError, match="unknown demo vision model"):
        demo_vision.mmproj_path("llava")


def test_demo_model_vision_prints_both_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = cli.main(["demo-model", "--vision", "gemma3", "--json", str(tmp_path / "pair")])
    document = json.loads(capsys.readouterr().out)
    assert code == 0 and document["image_tokens"] == demo_vision.fixed_image_tokens("gemma3")
    assert Path(document["mmproj_path"]).parent == Path(document["path"]).parent
    assert Path(document["mmproj_path"]).is_file()
