"""A prompt with images, as the engine schedules and caches it (plain data, no llama.cpp).

The scheduler and the prefix cache work on lists of token ids whose index is the position in
the sequence. An image keeps that true: it stands in the list as ``n_pos`` copies of a
*placeholder* — a negative id made from its pixel digest, so it never equals a real token
and two different images never share one — and takes ``n_pos`` positions, but ``n_tokens``
KV cells (more than ``n_pos`` on M-RoPE models, where an image advances the position by
``max(rows, columns)``). So the same image in the next turn of the same tenant matches the
slot's cached entries like text does, and is not encoded again; another tenant never reaches
a slot's entries at all (see ``slots``).

Counts shown to users (``prompt_tokens``, ``cached_tokens``) are KV cells, as mtmd counts
tokens: :meth:`ImagePrompt.cells_before` converts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from homelab.images.decoded import DecodedImage

PLACEHOLDER_SPACE = 2**30  # placeholders are -1 .. -2**30


def placeholder(digest: str) -> int:
    """The id an image's positions hold in a token list: negative, from its pixel digest."""
    return -1 - int(digest[:15], 16) % PLACEHOLDER_SPACE


def is_placeholder(token: int) -> bool:
    return token < 0


@dataclass(frozen=True)
class ImageSpan:
    """One image of a prompt: where it starts (an index = a position) and what it takes."""

    image: DecodedImage
    start: int
    n_pos: int  # positions (entries in the token list)
    n_tokens: int  # KV cells = tokens as mtmd counts them

    @property
    def end(self) -> int:
        return self.start + self.n_pos


@dataclass(frozen=True)
class ImagePrompt:
    """A tokenized prompt with images: ids (images as placeholder runs) and the images."""

    tokens: tuple[int, ...]
    images: tuple[ImageSpan, ...]

    @cached_property
    def n_cells(self) -> int:
        """KV cells the whole prompt takes (its ``prompt_tokens``)."""
        return self.cells_before(len(self.tokens))

    def cells_before(self, n_entries: int) -> int:
        """KV cells taken by the first ``n_entries`` entries (whole images only)."""
        extra = sum(span.n_tokens - span.n_pos for span in self.images if span.end <= n_entries)
        return n_entries + extra

    def image_at(self, entry: int) -> ImageSpan | None:
        """The image starting at ``entry``, if one does."""
        for span in self.images:
            if span.start == entry:
                return span
        return None

    def text_ahead(self, entry: int) -> int:
        """Text entries from ``entry`` to the next image (or the end)."""
        for span in self.images:
            if span.start >= entry:
                return span.start - entry
        return len(self.tokens) - entry

    def whole_images_only(self, n_entries: int) -> int:
        """``n_entries`` cut back to the start of an image it would end inside: a prefix
        reused from the cache holds whole images or none of them."""
        for span in self.images:
            if span.start < n_entries < span.end:
                return span.start
        return n_entries

    @property
    def text_tokens(self) -> list[int]:
        """The prompt's real token ids (what sampling penalties may see)."""
        return [token for token in self.tokens if not is_placeholder(token)]
