"""Every generated demo model really loads and generates in llama.cpp, and is reproducible."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import llama_cpp  # its high-level API, as an independent judge of the generated files
import pytest

from homelab.gguf import vocab
from homelab.gguf.demo import demo_model_path
from homelab.gguf.generator import ARCHS, write_f16_model

VARIANTS = [(arch, "F16") for arch in ARCHS] + [("llama", q) for q in ("Q8_0", "Q4_0", "Q4_K_M")]
VARIANT_IDS = [f"{arch}-{quant}" for arch, quant in VARIANTS]
ROUND_TRIP_TEXTS = [
    "hello world, the model is fast",
    "naïve café — déjà vu",
    "日本語のテキスト 🙂👍🏽",
    "tabs\tand\nnew lines  with  double spaces ",
    'JSON: {"name": "value", "n": [1, 2.5e-3]}',
    "Ünïcödé ß ∑ π ≠ ∞ 𝔘 \u200b zero-width",
]


@pytest.fixture(params=VARIANTS, ids=VARIANT_IDS)
def loaded(request: pytest.FixtureRequest, demo_model: Callable[..., Path]) -> Iterator[Any]:
    arch, quant = request.param
    model = llama_cpp.Llama(str(demo_model(arch, "tiny", quant)), n_ctx=256, verbose=False)
    yield model
    model.close()


def greedy_tokens(model: Any, prompt: str, n_tokens: int) -> list[int]:
    prompt_tokens = model.tokenize(prompt.encode(), add_bos=True, special=True)
    return list(islice(model.generate(prompt_tokens, temp=0.0), n_tokens))


def test_model_loads_and_generates_tokens(loaded: Any) -> None:
    tokens = greedy_tokens(loaded, "<|im_start|>user\nHello world<|im_end|>\n", 8)
    assert len(tokens) == 8
    assert all(0 <= token < loaded.n_vocab() for token in tokens)
    assert loaded.n_vocab() == 1024


def test_greedy_generation_is_repeatable(loaded: Any) -> None:
    first = greedy_tokens(loaded, "the model", 6)
    second = greedy_tokens(loaded, "the model", 6)
    assert first == second


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_vocabulary_round_trips_text(loaded: Any, text: str) -> None:
    tokens = loaded.tokenize(text.encode(), add_bos=False, special=False)
    assert loaded.detokenize(tokens).decode() == text


def test_english_is_tokenized_compactly_and_specials_are_recognised(loaded: Any) -> None:
    assert len(loaded.tokenize(b"hello world", add_bos=False)) < len(b"hello world")
    tokens = loaded.tokenize(b"<|im_start|>user", add_bos=True, special=True)
    assert tokens[:2] == [vocab.BOS_ID, vocab.IM_START_ID]
    assert loaded.token_eos() == vocab.EOS_ID


@pytest.mark.parametrize("arch", ARCHS)
def test_generating_twice_gives_identical_bytes(arch: str, tmp_path: Path) -> None:
    first = write_f16_model(tmp_path / "first.gguf", arch)
    second = write_f16_model(tmp_path / "second.gguf", arch)
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() == demo_model_path(arch).read_bytes()  # the cached copy too


def test_quantizing_twice_gives_identical_bytes(tmp_path: Path) -> None:
    from homelab.gguf.quantize import quantize_file

    source = demo_model_path("llama")
    first = quantize_file(source, tmp_path / "a.gguf", "Q4_K_M")
    second = quantize_file(source, tmp_path / "b.gguf", "Q4_K_M")
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() == demo_model_path("llama", quant="Q4_K_M").read_bytes()


def test_a_different_seed_gives_different_weights(tmp_path: Path) -> None:
    zero = write_f16_model(tmp_path / "zero.gguf", "llama", seed=0)
    one = write_f16_model(tmp_path / "one.gguf", "llama", seed=1)
    assert zero.stat().st_size == one.stat().st_size
    assert zero.read_bytes() != one.read_bytes()
