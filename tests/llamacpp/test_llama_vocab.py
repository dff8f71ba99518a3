"""The doorway's tokenizer: buffers sized by llama.cpp, specials, pieces, round trips."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from homelab.errors import EngineClosedError
from homelab.gguf import vocab as demo_vocab
from homelab.llamacpp.model import Model

MULTI_BYTE_TEXT = "日本語の テキスト 🙂👍🏽 naïve  café\n" * 8


@pytest.fixture(scope="module")
def demo(demo_model: Callable[..., Path]) -> Iterator[Model]:
    with Model.load(demo_model("llama")) as model:
        yield model


@pytest.fixture(scope="module")
def byte_model(byte_vocab_model: Path) -> Iterator[Model]:
    with Model.load(byte_vocab_model) as model:
        yield model


def test_a_byte_fallback_vocabulary_gives_more_tokens_than_bytes(byte_model: Model) -> None:
    tokens = byte_model.vocab.tokenize(MULTI_BYTE_TEXT, add_bos=True, parse_special=False)
    # every byte is one token, and SentencePiece writes each space as "▁" (three bytes)
    expected = len(MULTI_BYTE_TEXT.replace(" ", "\u2581").encode()) + 1  # + BOS
    assert len(tokens) == expected > len(MULTI_BYTE_TEXT.encode()) + 2
    assert tokens[0] == demo_vocab.BOS_ID
    # the "▁" came back as bytes, not as a piece, so llama.cpp does not turn it into a space
    assert byte_model.vocab.detokenize(tokens[1:]) == MULTI_BYTE_TEXT.replace(" ", "\u2581")


def test_the_demo_vocabulary_round_trips_and_is_compact(demo: Model) -> None:
    vocab = demo.vocab
    tokens = vocab.tokenize(MULTI_BYTE_TEXT, add_bos=False, parse_special=False)
    assert vocab.detokenize(tokens) == MULTI_BYTE_TEXT
    english = "hello world, the model is fast"
    assert len(vocab.tokenize(english, add_bos=False, parse_special=False)) <= len(english) // 2
    assert vocab.tokenize("", add_bos=False, parse_special=False) == []


def test_special_tokens_are_parsed_only_when_asked(demo: Model) -> None:
    vocab = demo.vocab
    parsed = vocab.tokenize("<|im_start|>user", add_bos=True, parse_special=True)
    assert parsed[:2] == [demo_vocab.BOS_ID, demo_vocab.IM_START_ID]
    spelled = vocab.tokenize("<|im_start|>user", add_bos=False, parse_special=False)
    assert demo_vocab.IM_START_ID not in spelled
    assert vocab.token_bytes(demo_vocab.IM_START_ID, special=True) == b"<|im_start|>"
    assert vocab.token_bytes(demo_vocab.IM_START_ID, special=False) == b""


def test_special_token_ids_match_the_file(demo: Model) -> None:
    vocab = demo.vocab
    assert vocab.n_tokens == 1024
    assert (vocab.bos, vocab.eos, vocab.adds_bos) == (demo_vocab.BOS_ID, demo_vocab.EOS_ID, True)
    eog = vocab.end_of_generation_tokens()
    assert {demo_vocab.EOS_ID, demo_vocab.IM_END_ID} <= eog
    assert demo_vocab.BOS_ID not in eog


def test_a_closed_model_refuses_to_tokenize_instead_of_crashing(
    demo_model: Callable[..., Path],
) -> None:
    model = Model.load(demo_model("llama"))
    vocab = model.vocab
    assert vocab.tokenize("hello", add_bos=False, parse_special=False)
    model.close()  # a fleet eviction while a request was still being prepared
    with pytest.raises(EngineClosedError, match="unloaded"):
        vocab.tokenize("hello", add_bos=False, parse_special=False)
    with pytest.raises(EngineClosedError):
        vocab.token_bytes(1, special=False)
