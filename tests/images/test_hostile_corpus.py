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

from benchmarks.hostile_inputs import PADDING_BYTES, rle8_bmp_with_noops
from homelab.images.decode import DEFAULT_MAX_IMAGE_PIXELS, ImageRejected, decode_image
from homelab.images.decoded import DecodedImage

BUDGET_S = 0.5  # each file, decoded or refused; the padded ones took 2-10 s before


def saved(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def gradient(mode: str = "RGB", size: tuple[int, int] = (64, 48)) -> Image.Image:
    image = Image.linear_gradient("L").resize(size)
    return image.convert(mode)


def halved(data: bytes) -> bytes:
    return data[: len(data) // 2]


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


def png_over_the_pixel_cap() -> bytes:
    """A PNG header declaring 5000x5000: under Pillow's own bomb guard, over ours."""
    head = b"\x89PNG\r\n\x1a\n"
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", 5000, 5000, 8, 2, 0, 0, 0))
    return head + ihdr + png_chunk(b"IDAT", zlib.compress(b"")) + png_chunk(b"IEND", b"")


def huge_gif_header() -> bytes:
    gif = bytearray(saved(gradient("P"), "GIF"))
    gif[6:10] = struct.pack("<HH", 65535, 65535)  # the logical screen
    frame = gif.index(b"\x2c")  # the first image descriptor
    gif[frame + 5 : frame + 9] = struct.pack("<HH", 65535, 65535)
    return bytes(gif)


def huge_bmp_header() -> bytes:
    bmp = bytearray(saved(gradient(), "BMP"))
    bmp[18:26] = struct.pack("<ii", 1 << 20, 1 << 20)
    return bytes(bmp)


def huge_webp_header() -> bytes:
    """A lossless WebP whose VP8L header says 16384x16384 (its two 14-bit fields full)."""
    webp = bytearray(saved(gradient(), "WEBP", lossless=True))
    at = webp.index(b"VP8L") + 9  # after the chunk header and the signature byte
    fields = int.from_bytes(webp[at : at + 4], "little")
    webp[at : at + 4] = (fields | (1 << 28) - 1).to_bytes(4, "little")
    return bytes(webp)


def png_48_bit() -> bytes:
    """16 bits a channel, RGB (Pillow keeps 8 of them)."""
    width, height = 64, 48
    pixel = ">HHH"
    rows = b"".join(
        b"\x00"
        + b"".join(struct.pack(pixel, x * 1000, y * 1300, (x + y) * 500) for x in range(width))
        for y in range(height)
    )
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0))
    head = b"\x89PNG\r\n\x1a\n" + ihdr
    return head + png_chunk(b"IDAT", zlib.compress(rows)) + png_chunk(b"IEND", b"")


def bmp_16_bpp() -> bytes:
    """RGB565 with its bit masks (BI_BITFIELDS): 16 bits a pixel."""
    width, height = 64, 48
    row = b"".join(
        struct.pack("<H", (x % 32) << 11 | (x % 64) << 5 | (31 - x % 32)) for x in range(width)
    )
    pixels, masks = row * height, struct.pack("<III", 0xF800, 0x07E0, 0x001F)
    offset = 14 + 40 + len(masks)
    header = struct.pack("<2sIHHI", b"BM", offset + len(pixels), 0, 0, offset)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 16, 3, len(pixels), 0, 0, 0, 0)
    return header + info + masks + pixels


def gif_of_many_frames() -> bytes:
    """300 distinct frames: only the first is decoded."""
    base = gradient("L")
    frames = [base.point(lambda v, i=i: (v + i) % 256).convert("P") for i in range(300)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    return buffer.getvalue()


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
    "truncated-gif": lambda: halved(saved(Image.effect_noise((640, 480), 60).convert("P"), "GIF")),
    "truncated-webp": lambda: halved(saved(gradient("RGB", (640, 480)), "WEBP")),
    "truncated-bmp": lambda: halved(saved(gradient("RGB", (640, 480)), "BMP")),
    "png-over-the-pixel-cap": png_over_the_pixel_cap,
    "huge-gif-header": huge_gif_header,
    "huge-bmp-header": huge_bmp_header,
    "huge-webp-header": huge_webp_header,
    "huge-png-header": huge_png_header,
    "huge-jpeg-header": huge_jpeg_header,
    "rle4-bmp": lambda: saved(gradient("P"), "BMP")[:30] + struct.pack("<I", 2) + b"\x00" * 2000,
}

DECODED: dict[str, Callable[[], bytes]] = {
    "lzw-heavy-gif": lzw_heavy_gif,
    "progressive-jpeg": lambda: saved(gradient(size=(800, 600)), "JPEG", progressive=True),
    "cmyk-jpeg": lambda: saved(gradient("CMYK"), "JPEG"),
    "16-bit-png": lambda: saved(gradient("I;16"), "PNG"),
    "16-bit-png-2048": lambda: saved(gradient("I;16", (2048, 2048)), "PNG"),
    "48-bit-png": png_48_bit,
    "16-bpp-bmp": bmp_16_bpp,
    "cmyk-progressive-jpeg": lambda: saved(gradient("CMYK", (800, 600)), "JPEG", progressive=True),
    "gif-300-frames": gif_of_many_frames,
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
    data = DECODED[name]()
    elapsed_s, outcome = timed_decode(data)
    assert isinstance(outcome, DecodedImage), outcome
    with Image.open(io.BytesIO(data)) as header:  # the size the file says, first frame only
        assert (outcome.width_px, outcome.height_px) == header.size
    assert outcome.width_px * outcome.height_px <= DEFAULT_MAX_IMAGE_PIXELS
    assert elapsed_s < BUDGET_S, f"{name}: {elapsed_s:.2f} s"


def test_rle_bmp_refusal_names_the_compression() -> None:
    with pytest.raises(ImageRejected, match="RLE8") as refused:
        decode_image(rle8_bmp_with_noops())
    assert refused.value.code == "image_too_complex"
