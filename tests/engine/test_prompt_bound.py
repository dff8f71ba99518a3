"""A prompt that cannot fit is refused after work bounded by the limit, never by its size."""

from __future__ import annotations

import time

import pytest
from engine_helpers import EngineFactory

from homelab.engine.prompt_bound import CUT_ALLOWANCE_TOKENS, PIECE_CHARS, pieces, tokenize_within
from homelab.errors import ContextLengthError


class CountingTokenizer:
    """One token per word (and per run of spaces): records how much text it was given."""

    def __init__(self) -> None:
        self.chars_seen = 0

    def __call__(self, text: str, add_bos: bool) -> list[int]:
        self.chars_seen += len(text)
        return ([1] if add_bos else []) + [2] * len(text.replace(" ", " x ").split())


def no_bound() -> int | None:
    return None


@pytest.mark.parametrize("size", [10_000, 1_000_000, 10_000_000])
def test_counting_in_pieces_stops_near_the_limit_whatever_the_size(size: int) -> None:
    tokenize = CountingTokenizer()
    text = ("word " * (size // 5))[:size]
    with pytest.raises(ContextLengthError, match="more than the 512 that fit"):
        tokenize_within(tokenize, text, 512, longest_token_bytes=no_bound)
    assert tokenize.chars_seen <= 2 * 512 * 5 + 2 * PIECE_CHARS  # never the whole text


def test_the_size_bound_refuses_without_tokenizing() -> None:
    tokenize = CountingTokenizer()
    with pytest.raises(ContextLengthError, match=r"bytes are at least \d+ tokens"):
        tokenize_within(tokenize, "x" * 4_000_000, 511, longest_token_bytes=lambda: 16)
    assert tokenize.chars_seen == 0


def test_a_text_that_fits_is_tokenized_whole_and_exactly() -> None:
    def tokenize(text: str, add_bos: bool) -> list[int]:
        return [ord(c) for c in text]  # one token per character

    text = "ab " * 7000  # 21,000 characters: counted in pieces first, then whole
    assert tokenize_within(tokenize, text, 21_000, longest_token_bytes=lambda: 4) == [
        ord(c) for c in text
    ]
    with pytest.raises(ContextLengthError, match="has 21000 tokens, more than the 20999"):
        tokenize_within(tokenize, text, 20_999, longest_token_bytes=no_bound)


def test_cuts_may_cost_a_few_tokens_without_a_false_refusal() -> None:
    """A tokenizer that adds a token at every piece start (as SentencePiece's space prefix
    does) must not get a text refused that fits when tokenized whole."""
    calls: list[int] = []

    def tokenize(text: str, add_bos: bool) -> list[int]:
        calls.append(len(text))
        return [0] * (len(text.split()) + 2)  # two extra tokens for every call

    text = "word " * 6000  # 6,002 tokens whole
    assert len(tokenize_within(tokenize, text, 6002, longest_token_bytes=no_bound)) == 6002
    assert len(calls) > 2 and CUT_ALLOWANCE_TOKENS >= 2


def test_pieces_join_back_and_cut_before_whitespace() -> None:
    text = "<|im_start|>user\n" + "the cache " * 3000 + "\u00e9" * 5000
    parts = [piece for _, piece in pieces(text, size=1000)]
    assert "".join(parts) == text
    assert all(len(piece) <= 1000 for piece in parts)
    assert all(piece[0] in " \n" for piece in parts[1:30])  # cut before a space or newline
    assert [end for end, _ in pieces(text, size=1000)][-1] == len(text)


def test_the_engine_refuses_a_huge_prompt_at_once(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=1, ctx_per_slot=256)
    assert engine.longest_token_bytes is not None and engine.longest_token_bytes >= 1
    started = time.perf_counter()
    with pytest.raises(ContextLengthError, match="that fit"):
        engine.tokenize_within("the cache " * 400_000, 255)
    assert time.perf_counter() - started < 1.0
    assert engine.tokenize_within("the cache", 255) == engine.tokenize("the cache")
