"""A corpus of hostile and unusual image files, generated here with Pillow: each one decodes
or is refused with ImageRejected, and none costs more than a bounded moment of work.

The padded files are small pictures carrying millions of records that Pillow walks in Python
(RLE no-op commands, PNG chunks, JPEG fill bytes, GIF comment blocks): before
:mod:`homelab.images.structure` each held a thread, and the GIL, for seconds.
"""

from __future__ import annotations

import io
import struct
import time
import zlib
from collections.abc import Callable

import pytest
from PIL import Image

from homelab.images.decode import ImageRejected, decode_image

BUDGET_S = 0.5  # each file, decoded or refused; the padded ones took 2-10 s before
PADDING_BYTES = 6 * 1024 * 1024  # well under the 20 MiB image cap


def saved(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def gradient(mode: str = "RGB", size: tuple[int, int] = (64, 48)) -> Image.Image:
    image = Image.linear_gradient("L").resize(size)
    return image.convert(mode)


def halved(data: bytes) -> bytes:
    return data[: len(data) // 2]


def rle8_bmp_with_noops() -> bytes:
    """A 2x2 RLE8 BMP whose pixel data is millions of 'delta (0, 0)' commands, then the end."""
    pixels = b"\x00\x02\x00\x00" * (PADDING_BYTES // 4) + b"\x02\x01\x00\x00\x00\x01"
    palette = b"\x00\x00\x00\x00" * 256
    offset = 14 + 40 + len(palette)
    header = struct.pack("<2sIHHI", b"BM", offset + len(pixels), 0, 0, offset)
    info = struct.pack("<IiiHHIIiiII", 40, 2, 2, 1, 8, 1, len(pixels), 0, 0, 256, 0)
    return header + info + palette + pixels


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    body = kind + payload
    return struct.pack(">I", len(payload)) + body + struct.pack(">I", zlib.crc32(body))


def png_with_tiny_chunks() -> bytes:
    """A 1x1 PNG whose compressed data is split into one-byte IDAT chunks, a million of them."""
    idat = zlib.compress(b"\x00\x00" * 1, 9)
    padding = png_chunk(b"tEXt", b"k\x00") * (PADDING_BYTES // 14)
    head = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
    return head + padding + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")


def jpeg_with_fill_bytes() -> bytes:
    """A small JPEG with millions of junk bytes between two marker segments."""
    jpeg = saved(gradient(), "JPEG")
    return jpeg[:2] + b"\x00" * PADDING_BYTES + jpeg[2:]


def jpeg_with_many_scans() -> bytes:
    """A progressive JPEG whose last scan is repeated hundreds of times."""
    jpeg = saved(gradient(), "JPEG", progressive=True)
    last_scan = jpeg.rindex(b"\xff\xda")
    return jpeg[:last_scan] + jpeg[last_scan:-2] * 500 + b"\xff\xd9"


def gif_with_comment_blocks() -> bytes:
    """A small GIF with a comment extension of millions of one-byte sub-blocks before its
    first frame."""
    gif = saved(gradient("P"), "GIF")
    flags = gif[10]
    first_block = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    comment = b"\x21\xfe" + b"\x01x" * (PADDING_BYTES // 2) + b"\x00"
    return gif[:first_block] + comment + gif[first_block:]


def lzw_heavy_gif() -> bytes:
    """A 1024x1024 GIF of noise: the LZW decoder's worst case, a few MiB of codes."""
    noise = Image.effect_noise((1024, 1024), 100).convert("P")
    return saved(noise, "GIF")


def huge_png_header() -> bytes:
    head = b"\x89PNG\r\n\x1a\n"
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", 2**31 - 1, 2**31 - 1, 8, 2, 0, 0, 0))
    return head + ihdr + png_chunk(b"IDAT", zlib.compress(b"")) + png_chunk(b"IEND", b"")


def huge_jpeg_header() -> bytes:
    jpeg = bytearray(saved(gradient(), "JPEG"))
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5 : sof + 9] = struct.pack(">HH", 65500, 65500)
    return bytes(jpeg)


REFUSED: dict[str, Callable[[], bytes]] = {
    "rle8-bmp-noops": rle8_bmp_with_noops,
    "png-million-chunks": png_with_tiny_chunks,
    "jpeg-junk-bytes": jpeg_with_fill_bytes,
    "jpeg-500-scans": jpeg_with_many_scans,
    "gif-comment-blocks": gif_with_comment_blocks,
    "truncated-png": lambda: halved(saved(gradient("RGB", (640, 480)), "PNG")),
    "truncated-jpeg": lambda: halved(saved(gradient("RGB", (640, 480)), "JPEG")),
    "huge-png-header": huge_png_header,
    "huge-jpeg-header": huge_jpeg_header,
    "rle4-bmp": lambda: saved(gradient("P"), "BMP")[:30] + struct.pack("<I", 2) + b"\x00" * 2000,
}

DECODED: dict[str, Callable[[], bytes]] = {
    "lzw-heavy-gif": lzw_heavy_gif,
    "progressive-jpeg": lambda: saved(gradient(size=(800, 600)), "JPEG", progressive=True),
    "cmyk-jpeg": lambda: saved(gradient("CMYK"), "JPEG"),
    "16-bit-png": lambda: saved(gradient("I;16"), "PNG"),
    "palette-bmp": lambda: saved(gradient("P"), "BMP"),
    "grayscale-webp": lambda: saved(gradient("L"), "WEBP"),
}


def timed_decode(data: bytes) -> tuple[float, object]:
    started = time.perf_counter()
    try:
        outcome: object = decode_image(data)
    except ImageRejected as exc:
        outcome = exc
    return time.perf_counter() - started, outcome


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_hostile_files_are_refused_quickly(name: str) -> None:
    elapsed_s, outcome = timed_decode(REFUSED[name]())
    assert isinstance(outcome, ImageRejected), f"{name} decoded"
    assert str(outcome).strip() and outcome.hint, "the refusal says what to do"
    assert elapsed_s < BUDGET_S, f"{name}: {elapsed_s:.2f} s"


@pytest.mark.parametrize("name", sorted(DECODED))
def test_unusual_but_real_files_decode_quickly(name: str) -> None:
    elapsed_s, outcome = timed_decode(DECODED[name]())
    assert not isinstance(outcome, ImageRejected), outcome
    assert elapsed_s < BUDGET_S, f"{name}: {elapsed_s:.2f} s"


def test_rle_bmp_refusal_names_the_compression() -> None:
    with pytest.raises(ImageRejected, match="RLE8") as refused:
        decode_image(rle8_bmp_with_noops())
    assert refused.value.code == "image_too_complex"
