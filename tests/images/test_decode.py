"""Encoded bytes -> DecodedImage: the formats llama-server reads, normalised to RGB, and every
hostile or broken input refused with one ImageRejected that says what to do."""

from __future__ import annotations

import io
import struct
import time
import zlib

import numpy as np
import pytest
from PIL import Image

from homelab.errors import HomelabError
from homelab.images.decode import ImageLimits, ImageRejected, decode_image, sniff_format


def encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


RED = Image.new("RGB", (6, 4), (250, 0, 0))


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "WEBP", "GIF", "JPEG"])
def test_each_format_decodes_to_packed_rgb(fmt: str) -> None:
    options = {"lossless": True} if fmt == "WEBP" else {}
    image = decode_image(encoded(RED, fmt, **options))
    assert (image.width_px, image.height_px, len(image.rgb)) == (6, 4, 6 * 4 * 3)
    red, green, blue = image.rgb[:3]
    assert red > 200 and green < 40 and blue < 40


def test_lossless_files_of_the_same_pixels_share_a_digest() -> None:
    digests = {decode_image(encoded(RED, fmt)).digest for fmt in ("PNG", "BMP")}
    assert len(digests) == 1


def test_exif_orientation_is_applied() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    image = decode_image(encoded(RED, "JPEG", exif=exif.tobytes()))
    assert (image.width_px, image.height_px) == (4, 6)


def test_alpha_and_palette_transparency_land_on_white() -> None:
    clear = Image.new("RGBA", (2, 2), (0, 0, 0, 0))
    assert decode_image(encoded(clear, "PNG")).rgb == b"\xff" * 12
    half = Image.new("LA", (1, 1), (0, 128))
    assert decode_image(encoded(half, "PNG")).rgb == bytes([127] * 3)
    palette = Image.new("P", (2, 1), 0)
    palette.putpalette([0, 0, 0, 9, 9, 9])
    palette.putpixel((1, 0), 1)
    image = decode_image(encoded(palette, "PNG", transparency=0))
    assert image.rgb == b"\xff\xff\xff\x09\x09\x09"


def test_cmyk_grayscale_and_16_bit_become_8_bit_rgb() -> None:
    cmyk = decode_image(encoded(Image.new("CMYK", (2, 2), (0, 0, 0, 0)), "JPEG"))
    assert min(cmyk.rgb) > 240  # no ink: white
    deep = Image.fromarray(np.array([[0, 32768, 65535]], dtype=np.uint16))
    assert decode_image(encoded(deep, "PNG")).rgb == bytes([0] * 3 + [128] * 3 + [255] * 3)
    gray = Image.new("L", (1, 1), 77)
    assert decode_image(encoded(gray, "BMP")).rgb == bytes([77] * 3)


def test_a_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (3, 3), color) for color in ((255, 0, 0), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    image = decode_image(buffer.getvalue())
    assert image.rgb[0] > 200 and image.rgb[2] < 40


def _bomb(width_px: int, height_px: int) -> bytes:
    data = bytearray(encoded(RED, "PNG"))
    ihdr = struct.pack(">II", width_px, height_px) + bytes(data[24:29])
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return bytes(data)


@pytest.mark.parametrize(
    ("data", "declared", "code", "says"),
    [
        (b"", None, "image_invalid", "empty"),
        (encoded(RED, "PNG")[:40], None, "image_invalid", "truncated"),
        (encoded(RED, "JPEG")[:30] + b"\x00" * 200, None, "image_invalid", "corrupt"),
        (_bomb(60_000, 60_000), None, "image_too_large", "decompression bomb"),
        (_bomb(5000, 5000), None, "image_too_large", "5000x5000"),
        (_bomb(0, 10), None, "image_invalid", ""),
        (encoded(RED, "PNG"), "image/jpeg", "image_type", "Name it image/png"),
        (
            b"<?xml version='1.0'?>\n<svg xmlns='http://www.w3.org/2000/svg'/>",
            None,
            "image_type",
            "SVG",
        ),
        (b"%PDF-1.7 not an image", "image/png", "image_type", "not an image"),
        (encoded(RED, "TIFF"), None, "image_type", "not an image"),
    ],
    ids=["empty", "truncated", "corrupt", "bomb", "over-cap", "zero", "mime", "svg", "pdf", "tiff"],
)
def test_refusals(data: bytes, declared: str | None, code: str, says: str) -> None:
    with pytest.raises(ImageRejected) as refused:
        decode_image(data, declared)
    assert refused.value.code == code
    assert says in str(refused.value)
    assert isinstance(refused.value, HomelabError) and refused.value.hint  # says what to do


def test_mime_aliases_and_byte_cap() -> None:
    jpeg = encoded(RED, "JPEG")
    assert decode_image(jpeg, "image/jpg").width_px == 6
    with pytest.raises(ImageRejected, match="more than the 100 this server accepts"):
        decode_image(jpeg, limits=ImageLimits(max_bytes=100))
    assert sniff_format(jpeg) == "JPEG"


def test_a_bomb_is_refused_before_decoding() -> None:
    """The declared size is checked from the header: no time or memory spent on pixels."""
    started = time.perf_counter()
    with pytest.raises(ImageRejected):
        decode_image(_bomb(4097, 4097))
    assert time.perf_counter() - started < 0.05
