"""The one shape an image takes inside homelab once it has been decoded."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DecodedImage:
    """Pixels ready for a vision projector: packed RGB, 3 bytes a pixel, rows top to bottom.

    ``digest`` is the SHA-256 of the size and the pixels, not of the encoded file: the same
    picture sent again (as the same or another lossless file) keys the same cached tokens.
    """

    rgb: bytes = field(repr=False)
    width_px: int
    height_px: int
    digest: str = ""

    def __post_init__(self) -> None:
        if self.width_px <= 0 or self.height_px <= 0:
            raise ValueError(
                f"an image needs a positive size, got {self.width_px}x{self.height_px}"
            )
        if len(self.rgb) != self.width_px * self.height_px * 3:
            raise ValueError(
                f"{len(self.rgb)} bytes of RGB do not make a {self.width_px}x{self.height_px} image"
            )
        if not self.digest:
            object.__setattr__(
                self, "digest", pixel_digest(self.rgb, self.width_px, self.height_px)
            )


def pixel_digest(rgb: bytes, width_px: int, height_px: int) -> str:
    """SHA-256 over the size and the pixels: the key an image's cached tokens live under."""
    hasher = hashlib.sha256(f"{width_px}x{height_px}:".encode())
    hasher.update(rgb)
    return hasher.hexdigest()
