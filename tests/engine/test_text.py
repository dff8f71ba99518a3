"""Utf8Decoder and StopMatcher: the byte-stream-to-client-text state machines."""

from __future__ import annotations

import itertools
import random

import pytest

from homelab.engine.text import REPLACEMENT_CHARACTER, StopMatcher, Utf8Decoder

MIXED_TEXT = "a é 日本 🙂 z\u0301 ∑x"  # 1-, 2-, 3- and 4-byte characters, a combining mark


def decode_in_pieces(data: bytes, cuts: list[int]) -> list[str]:
    decoder = Utf8Decoder()
    bounds = [0, *cuts, len(data)]
    pieces = [decoder.feed(data[start:end]) for start, end in itertools.pairwise(bounds)]
    pieces.append(decoder.flush())
    return pieces


# --- Utf8Decoder -------------------------------------------------------------------------


def test_byte_by_byte_decoding_rebuilds_the_text_and_never_splits_a_character() -> None:
    data = MIXED_TEXT.encode()
    decoder = Utf8Decoder()
    pieces = []
    for index in range(len(data)):
        pieces.append(decoder.feed(data[index : index + 1]))
        assert decoder.pending_bytes <= 3
    assert decoder.flush() == ""
    assert "".join(pieces) == MIXED_TEXT
    assert REPLACEMENT_CHARACTER not in "".join(pieces)


@pytest.mark.parametrize("cut", range(1, len(MIXED_TEXT.encode())))
def test_one_cut_at_every_byte_boundary(cut: int) -> None:
    data = MIXED_TEXT.encode()
    pieces = decode_in_pieces(data, [cut])
    assert "".join(pieces) == MIXED_TEXT
    # The first piece is exactly the characters whose bytes all arrived before the cut.
    assert pieces[0] == data[:cut].decode("utf-8", errors="ignore")


def test_two_cuts_inside_one_four_byte_character() -> None:
    data = "🙂".encode()
    assert decode_in_pieces(data, [1, 3]) == ["", "", "🙂", ""]


def test_invalid_byte_is_replaced_at_once_instead_of_stalling() -> None:
    decoder = Utf8Decoder()
    assert decoder.feed(b"a\xffb") == f"a{REPLACEMENT_CHARACTER}b"
    assert decoder.pending_bytes == 0


def test_interrupted_character_is_replaced_when_the_next_byte_cannot_continue_it() -> None:
    decoder = Utf8Decoder()
    assert decoder.feed("日".encode()[:2]) == ""
    assert decoder.pending_bytes == 2
    assert decoder.feed(b"x") == f"{REPLACEMENT_CHARACTER}x"


@pytest.mark.parametrize(
    "invalid",
    [b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80", b"\xfe\xff"],
    ids=["overlong", "surrogate", "above-U+10FFFF", "lone-continuation", "never-valid"],
)
def test_invalid_sequences_become_replacement_characters(invalid: bytes) -> None:
    decoder = Utf8Decoder()
    text = decoder.feed(invalid + b"ok") + decoder.flush()
    assert text.endswith("ok")
    assert set(text[:-2]) == {REPLACEMENT_CHARACTER}


def test_a_whole_piece_is_taken_as_it_is_only_when_nothing_is_pending() -> None:
    """``feed(data, whole)``: the scheduler passes a token's text when its bytes are complete
    UTF-8 by themselves; it must not skip bytes still pending from the tokens before."""
    decoder = Utf8Decoder()
    assert decoder.feed(b"ab", "ab") == "ab"
    assert decoder.feed(b"\xc3") == ""  # the first byte of "é"
    assert decoder.feed(b"a", "a") == REPLACEMENT_CHARACTER + "a"  # cannot continue it
    assert decoder.feed(b"\xe2\x82") == ""  # two bytes of "€"
    assert decoder.feed(b"\xac!", None) == "€!"
    assert decoder.feed("é".encode(), "é") == "é"


def test_flush_replaces_an_unfinished_character_and_resets() -> None:
    decoder = Utf8Decoder()
    assert decoder.feed("é".encode()[:1]) == ""
    assert decoder.flush() == REPLACEMENT_CHARACTER
    assert decoder.feed("é".encode()) == "é"


def test_random_bytes_never_keep_more_than_three_pending() -> None:
    rng = random.Random(7)
    decoder = Utf8Decoder()
    produced = 0
    for _ in range(2000):
        produced += len(decoder.feed(bytes([rng.randrange(256)])))
        assert decoder.pending_bytes <= 3
    assert produced > 1500


# --- StopMatcher -------------------------------------------------------------------------


def run_matcher(stops: list[str], chunks: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    emitted = []
    for chunk in chunks:
        safe, stopped = matcher.feed(chunk)
        emitted.append(safe)
        if stopped:
            return "".join(emitted), True
    emitted.append(matcher.flush())
    return "".join(emitted), False


def expected_cut(text: str, stops: list[str]) -> tuple[str, bool]:
    hits = [text.find(stop) for stop in stops if stop and stop in text]
    return (text[: min(hits)], True) if hits else (text, False)


def test_stop_split_across_many_feeds() -> None:
    text = "Hello <|end|> world"
    assert run_matcher(["<|end|>"], list(text)) == ("Hello ", True)


def test_text_that_only_looks_like_a_stop_is_released_when_it_diverges() -> None:
    matcher = StopMatcher(["</s>"])
    assert matcher.feed("a </") == ("a ", False)
    assert matcher.feed("p>") == ("</p>", False)
    assert matcher.flush() == ""


def test_held_back_prefix_is_released_by_flush() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("ends with ST") == ("ends with ", False)
    assert matcher.flush() == "ST"


def test_stop_at_the_very_beginning() -> None:
    assert StopMatcher(["###"]).feed("###rest") == ("", True)


def test_overlapping_stops_the_earliest_wins() -> None:
    assert run_matcher(["bcd", "abc"], ["xab", "cd"]) == ("x", True)
    assert run_matcher(["abcd", "bc"], ["a", "b", "c", "d"]) == ("a", True)


def test_stop_that_is_a_prefix_of_another() -> None:
    assert run_matcher(["User:", "User"], ["Hi. Us", "er: x"]) == ("Hi. ", True)


def test_self_overlapping_stop() -> None:
    # "aab" inside "aaab": a naive matcher that drops held text on mismatch misses it.
    assert run_matcher(["aab"], ["a", "a", "a", "b"]) == ("a", True)


def test_empty_stops_are_ignored() -> None:
    assert run_matcher(["", ""], ["some", " text"]) == ("some text", False)
    assert StopMatcher([""]).feed("x") == ("x", False)


def test_stopped_matcher_stays_stopped() -> None:
    matcher = StopMatcher(["\n\n"])
    assert matcher.feed("a\n\nb") == ("a", True)
    assert matcher.feed("more") == ("", True)
    assert matcher.flush() == ""
    assert matcher.stopped


def test_multibyte_stop_strings() -> None:
    assert run_matcher(["日本"], ["今日は", "日", "本語"]) == ("今日は", True)


def test_random_chunkings_match_a_simple_reference() -> None:
    rng = random.Random(11)
    alphabet = "ab<|>é"
    for _ in range(400):
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4))) for _ in range(3)]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 8))))
        bounds = [0, *cuts, len(text)]
        chunks = [text[start:end] for start, end in itertools.pairwise(bounds)]
        assert run_matcher(stops, chunks) == expected_cut(text, stops), (stops, chunks)


def test_held_back_text_is_never_longer_than_the_longest_stop() -> None:
    matcher = StopMatcher(["abcdef", "xyz"])
    released = 0
    for fed, char in enumerate("abcdeabcdeabcde" * 50, start=1):
        safe, _ = matcher.feed(char)
        released += len(safe)
        assert fed - released <= len("abcdef") - 1
