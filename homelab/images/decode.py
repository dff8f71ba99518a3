"""Encoded image bytes -> :class:`~homelab.images.decoded.DecodedImage`, or a clear refusal.

What a client sends is untrusted. Before any pixel is decoded the bytes are capped, their
format is sniffed from the magic bytes (PNG, JPEG, WebP, GIF, BMP: what llama-server's stb
reads; SVG and everything else refused) and checked against the MIME type the client named,
and the dimensions the header declares are checked against a pixel cap (a decompression bomb
declares a huge size in a few bytes), and the records Pillow would walk in Python are
counted against a budget (:mod:`homelab.images.structure`: RLE BMP refused). Only then does
Pillow decode, restricted to those formats. The result is normalised to packed RGB: EXIF
orientation applied, alpha composited on white, palette / CMYK / 16-bit / grayscale
converted; a GIF or WebP gives its first frame. Every refusal is one
:class:`ImageRejected` saying what was wrong and what to do.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from homelab.errors import HomelabError
from homelab.images.decoded import DecodedImage
from homelab.images.structure import StructureRefused, check_structure

MIB = 1024 * 1024
DEFAULT_MAX_IMAGE_BYTES = 20 * MIB  # OpenAI's per-image limit
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096  # 48 MiB of RGB; Pillow's own bomb guard is 89 M
SNIFF_BYTES = 512
# format -> the MIME type it is sent as (the one a client should name)
FORMAT_MIME = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "WEBP": "image/webp",
    "GIF": "image/gif",
    "BMP": "image/bmp",
}
MIME_ALIASES = {
    "image/jpg": "image/jpeg",
    "image/pjpeg": "image/jpeg",
    "image/x-ms-bmp": "image/bmp",
}
SUPPORTED = "PNG, JPEG, WebP, GIF or BMP"
WHITE = (255, 255, 255)


class ImageRejected(HomelabError):
    """An image this server will not decode; ``code`` names the kind of problem."""

    title = "Image refused"

    def __init__(self, message: str, *, code: str, hint: str | None = None) -> None:
        self.code = code
        super().__init__(message, hint=hint)


@dataclass(frozen=True)
class ImageLimits:
    """What one image may cost: its encoded bytes and its declared pixels."""

    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS


def decode_image(
    data: bytes, declared_mime: str | None = None, limits: ImageLimits | None = None
) -> DecodedImage:
    """``data`` (a whole encoded file) as RGB pixels; ``declared_mime`` is what the client
    said it is (None: not said). Raises :class:`ImageRejected`."""
    limits = limits or ImageLimits()
    check_size(len(data), limits)
    image_format = sniff_format(data)
    check_declared(declared_mime, image_format)
    try:
        check_structure(data, image_format)
    except StructureRefused as exc:
        raise ImageRejected(exc.message, code="image_too_complex", hint=exc.hint) from None
    with _opened(data, image_format) as image:
        check_pixels(image.size, limits)
        rgb = _rgb_of(_loaded(image))
    width_px, height_px = rgb.size
    return DecodedImage(rgb.tobytes(), width_px, height_px)


def check_size(size_bytes: int, limits: ImageLimits) -> None:
    if size_bytes > limits.max_bytes:
        raise ImageRejected(
            f"the image is {size_bytes} bytes, more than the {limits.max_bytes} this server "
            "accepts",
            code="image_too_large",
            hint="Send a smaller or more compressed image (JPEG or WebP).",
        )
    if size_bytes == 0:
        raise ImageRejected(
            "the image is empty (0 bytes)", code="image_invalid", hint="Send the file's bytes."
        )


def sniff_format(data: bytes) -> str:
    """The format the magic bytes say (a key of :data:`FORMAT_MIME`)."""
    head = data[:SNIFF_BYTES]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if head.startswith(b"BM"):
        return "BMP"
    if b"<svg" in head.lower():
        raise ImageRejected(
            "SVG images are not accepted (vector graphics, and scripts, not pixels)",
            code="image_type",
            hint=f"Render it to {SUPPORTED} first.",
        )
    raise ImageRejected(
        "the data is not an image this server reads", code="image_type", hint=f"Send {SUPPORTED}."
    )


def check_declared(declared_mime: str | None, image_format: str) -> None:
    """The MIME type the client named must be the one the bytes are."""
    if declared_mime is None:
        return
    declared = MIME_ALIASES.get(declared_mime.strip().lower(), declared_mime.strip().lower())
    actual = FORMAT_MIME[image_format]
    if declared != actual:
        raise ImageRejected(
            f"the image is declared as {declared_mime!r} but its bytes are {image_format}",
            code="image_type",
            hint=f"Name it {actual}.",
        )


def check_pixels(size_px: tuple[int, int], limits: ImageLimits) -> None:
    width_px, height_px = size_px
    if width_px <= 0 or height_px <= 0:
        raise ImageRejected(
            f"the image declares an empty size ({width_px}x{height_px})",
            code="image_invalid",
            hint="Re-save it; the file is damaged.",
        )
    if width_px * height_px > limits.max_pixels:
        raise ImageRejected(
            f"the image declares {width_px}x{height_px} pixels, more than the "
            f"{limits.max_pixels} this server decodes",
            code="image_too_large",
            hint="Scale it down before sending it.",
        )


def _opened(data: bytes, image_format: str) -> Image.Image:
    """The header read (no pixels yet), by the one decoder the magic bytes named."""
    try:
        return Image.open(io.BytesIO(data), formats=[image_format])
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageRejected(  # Pillow's own guard, far above ours, saw it first
            f"the {image_format} header declares hundreds of millions of pixels "
            "(a decompression bomb)",
            code="image_too_large",
            hint="Scale it down before sending it.",
        ) from None
    except Exception as exc:  # Pillow raises many types for a damaged header
        raise _undecodable(image_format, exc) from None


def _loaded(image: Image.Image) -> Image.Image:
    """The first frame decoded, turned upright by its EXIF orientation."""
    try:
        image.seek(0)
        image.load()
        return ImageOps.exif_transpose(image)
    except Exception as exc:  # truncated, corrupt, or an unreadable EXIF block
        raise _undecodable(image.format or "image", exc) from None


def _undecodable(image_format: str, exc: BaseException) -> ImageRejected:
    detail = str(exc) or type(exc).__name__
    return ImageRejected(
        f"the {image_format} data could not be decoded ({detail}); it is truncated or corrupt",
        code="image_invalid",
        hint="Send the whole file again, or re-save it.",
    )


def _rgb_of(image: Image.Image) -> Image.Image:
    """Packed 8-bit RGB: deep grayscale scaled down, alpha composited on white."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        image = _eight_bit_gray(image)
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, WHITE)
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    try:
        return image.convert("RGB")
    except ValueError as exc:
        raise ImageRejected(
            f"images in colour mode {image.mode} are not supported ({exc})",
            code="image_type",
            hint="Re-save it as an 8-bit RGB image.",
        ) from None


def _eight_bit_gray(image: Image.Image) -> Image.Image:
    """16-bit (or 32-bit) grayscale to 8-bit, keeping the top bits (not clipping)."""
    values = np.asarray(image, dtype=np.float64)
    top = 1.0 if image.mode == "F" else 65535.0
    scaled = np.clip(values * (255.0 / top), 0, 255).round().astype(np.uint8)
    return Image.fromarray(scaled)  # 2-D uint8: mode L
