"""Which model a file holds, cheaply: a hash of its GGUF headers, sizes and data samples.

A saved prompt state is only valid for the weights that computed it. Hashing a multi-GB file
at start-up would cost minutes, so the identity hashes what tells models apart: every part's
header bytes (metadata and tensor infos: names, types, shapes, offsets), its size, and
three small samples of its tensor data (start, middle, end — two generated models with the
same shapes differ there). The path is not part of it: a file moved elsewhere is the same
model.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from homelab.gguf.reader import read_header_file, split_parts

SAMPLE_BYTES = 64 * 1024
IDENTITY_HEX_CHARS = 32


def model_identity(path: str | Path) -> str:
    """A short hex digest naming the model in ``path`` (a file or any part of a split set)."""
    digest = hashlib.sha256()
    for part in split_parts(Path(path).expanduser()):
        _hash_part(digest, part)
    return digest.hexdigest()[:IDENTITY_HEX_CHARS]


def _hash_part(digest: hashlib._Hash, part: Path) -> None:
    data_offset = read_header_file(part).data_offset
    file_bytes = part.stat().st_size
    digest.update(file_bytes.to_bytes(8, "little"))
    with part.open("rb") as handle:
        digest.update(handle.read(data_offset))
        for offset in _sample_offsets(data_offset, file_bytes):
            handle.seek(offset)
            digest.update(handle.read(SAMPLE_BYTES))


def _sample_offsets(data_offset: int, file_bytes: int) -> tuple[int, ...]:
    last = max(data_offset, file_bytes - SAMPLE_BYTES)
    middle = data_offset + (last - data_offset) // 2
    return (data_offset, middle, last)
