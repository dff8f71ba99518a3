"""The engine's form of a prompt with images, and what it refuses (no model needed)."""

from __future__ import annotations

import pytest

from homelab.engine.image_prefill import check_image_prompt
from homelab.engine.image_prompt import ImagePrompt, ImageSpan, placeholder
from homelab.errors import EngineError
from homelab.images.decoded import DecodedImage

RED = DecodedImage(bytes([255, 0, 0]) * 4, 2, 2)
BLUE = DecodedImage(bytes([0, 0, 255]) * 4, 2, 2)


def prompt() -> ImagePrompt:
    """3 text tokens, RED (4 positions, 12 cells: M-RoPE), 2 text, BLUE (2, 2), 1 text."""
    red, blue = placeholder(RED.digest), placeholder(BLUE.digest)
    tokens = (1, 2, 3, *[red] * 4, 4, 5, *[blue] * 2, 6)
    return ImagePrompt(tokens, (ImageSpan(RED, 3, 4, 12), ImageSpan(BLUE, 9, 2, 2)))


def test_placeholders_are_negative_and_differ_by_pixels() -> None:
    assert placeholder(RED.digest) < 0 and placeholder(BLUE.digest) < 0
    assert placeholder(RED.digest) != placeholder(BLUE.digest)
    assert placeholder(DecodedImage(RED.rgb, 2, 2).digest) == placeholder(RED.digest)


def test_cells_count_whole_images_as_mtmd_counts_their_tokens() -> None:
    p = prompt()
    assert p.n_cells == len(p.tokens) - 4 + 12
    assert p.cells_before(3) == 3 and p.cells_before(5) == 5  # inside RED: not yet counted
    assert p.cells_before(7) == 3 + 12


def test_a_reused_prefix_never_ends_inside_an_image() -> None:
    p = prompt()
    assert [p.whole_images_only(n) for n in (3, 4, 6, 7, 10, 11)] == [3, 3, 3, 7, 9, 11]


def test_text_ahead_stops_at_the_next_image() -> None:
    p = prompt()
    assert [p.text_ahead(n) for n in (0, 3, 7, 9, 11)] == [3, 0, 2, 0, 1]
    assert p.image_at(3) is p.images[0] and p.image_at(4) is None
    assert p.text_tokens == [1, 2, 3, 4, 5, 6]


def test_what_the_scheduler_cannot_read_is_refused() -> None:
    p = prompt()
    check_image_prompt(p, non_causal=True, n_ubatch=12)  # RED (12 tokens) fits one ubatch
    with pytest.raises(EngineError, match="does not fit in one batch of 8"):
        check_image_prompt(p, non_causal=True, n_ubatch=8)
    check_image_prompt(p, non_causal=False, n_ubatch=8)  # a causal image is split
    ending = ImagePrompt(p.tokens[:11], p.images)
    with pytest.raises(EngineError, match="ends with an image"):
        check_image_prompt(ending, non_causal=False, n_ubatch=512)
