"""What an encoded file would cost Pillow's pure-Python parts, bounded before Pillow opens it.

The pixel cap bounds the memory a decode takes, not its work: Pillow walks a PNG's chunks,
a JPEG's marker segments (and any junk between them, one byte at a time), a GIF's extension
sub-blocks and a BMP's RLE commands in Python, so a small picture padded with millions of
no-op records holds a thread (and the GIL) for seconds. Each walker here follows the same
records with a fixed budget of steps, jumping over payloads, and refuses a file that needs
more steps than any real encoder writes; RLE-compressed BMP is refused outright (Pillow
decodes it in Python; llama-server's stb does not read it at all). A progressive JPEG's scans
are counted too: libjpeg revisits every coefficient once per scan.
"""

from __future__ import annotations

import struct

from homelab.errors import HomelabError

MAX_PNG_CHUNKS = 10_000  # real encoders: a few dozen (IDAT split at 8-64 KiB)
MAX_JPEG_HEADER_STEPS = 4_096  # marker segments and fill bytes before the first scan
MAX_JPEG_SCANS = 64  # progressive encoders write about 10
MAX_GIF_HEADER_BLOCKS = 4_096  # extension sub-blocks before the first frame
BMP_RLE = {1: "RLE8", 2: "RLE4"}
JPEG_STANDALONE = {0x01, *range(0xD0, 0xD9)}  # TEM, RSTn, SOI: no length field


class StructureRefused(HomelabError):
    """A file whose records would cost more decode work than this server spends."""

    title = "Image refused"


def check_structure(data: bytes, image_format: str) -> None:
    """Raise :class:`StructureRefused` when ``data`` (sniffed as ``image_format``) would make
    Pillow's Python code loop more than the budget allows."""
    walker = {"PNG": _png, "JPEG": _jpeg, "GIF": _gif, "BMP": _bmp}.get(image_format)
    if walker is not None:
        walker(data)


def _refuse(what: str) -> StructureRefused:
    return StructureRefused(
        f"{what}; no real encoder writes that, and decoding it would stall the server",
        hint="Re-save the image with an ordinary encoder (PNG or baseline JPEG).",
    )


def _png(data: bytes) -> None:
    offset, chunks = 8, 0
    while offset + 8 <= len(data):
        (length,) = struct.unpack_from(">I", data, offset)
        chunks += 1
        if chunks > MAX_PNG_CHUNKS:
            raise _refuse(f"the PNG has more than {MAX_PNG_CHUNKS} chunks")
        if data[offset + 4 : offset + 8] == b"IEND":
            return
        offset += 12 + length


def _jpeg(data: bytes) -> None:
    offset, steps = 2, 0
    while offset + 1 < len(data):
        steps += 1
        if steps > MAX_JPEG_HEADER_STEPS:
            raise _refuse(
                f"the JPEG has more than {MAX_JPEG_HEADER_STEPS} records before its image"
            )
        if data[offset] != 0xFF or data[offset + 1] in (0x00, 0xFF):
            offset += 1  # junk or a fill byte: Pillow steps over these one at a time
            continue
        marker = data[offset + 1]
        if marker == 0xDA:  # start of scan: the rest is entropy-coded data
            break
        if marker in JPEG_STANDALONE:
            offset += 2
            continue
        if offset + 4 > len(data):
            return
        (length,) = struct.unpack_from(">H", data, offset + 2)
        offset += 2 + length
    scans = data.count(b"\xff\xda")  # 0xFF in coded data is stuffed: only real markers match
    if scans > MAX_JPEG_SCANS:
        raise _refuse(f"the JPEG has {scans} scans, more than the {MAX_JPEG_SCANS} accepted")


def _gif(data: bytes) -> None:
    if len(data) < 13:
        return
    flags = data[10]
    offset = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    blocks = 0
    while offset < len(data) and data[offset] == 0x21:  # an extension, before the first frame
        offset += 2  # introducer and label
        while offset < len(data):
            blocks += 1
            if blocks > MAX_GIF_HEADER_BLOCKS:
                raise _refuse(
                    f"the GIF has more than {MAX_GIF_HEADER_BLOCKS} extension blocks before its "
                    "first frame"
                )
            size = data[offset]
            offset += 1 + size
            if size == 0:
                break


def _bmp(data: bytes) -> None:
    if len(data) < 34:
        return
    (header_bytes,) = struct.unpack_from("<I", data, 14)
    if header_bytes < 40:  # OS/2's 12-byte header has no compression field
        return
    (compression,) = struct.unpack_from("<I", data, 30)
    if compression in BMP_RLE:
        raise StructureRefused(
            f"{BMP_RLE[compression]}-compressed BMP images are not accepted",
            hint="Re-save it as an uncompressed BMP, or as PNG.",
        )
