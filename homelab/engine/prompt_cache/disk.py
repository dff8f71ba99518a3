"""State files: one per (model, tenant, tokens), written atomically, checked when read.

    <root>/<ModelKey.digest>/<tenant identity digest>/<tokens digest>.state

A file is ``MAGIC | u32 version | u32 header length | header (JSON: the whole key, token
count, state size) | tokens (int32) | state | SHA-256 of everything before``. It is written
to a temporary name in the same folder and renamed, so a reader never sees half a file;
files are 0600 in 0700 folders (a state is the tenant's prompt in another form); the
temporary name carries the writer's pid, so a cache opening the folder deletes only the
temporary files of processes that are gone, never a running server's. A file
whose checksum, size, header or place does not agree — truncated, corrupt, moved in from
another model's or tenant's folder — is :class:`StateFileError`, and the store drops it.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import psutil

from homelab.engine.prompt_cache.entry import TOKEN_DTYPE, StateEntry, as_tokens
from homelab.engine.prompt_cache.key import ModelKey, short_digest, tokens_digest

MAGIC = b"HLPC"
VERSION = 1
SUFFIX = ".state"
TEMP_MARK = ".tmp-"
_FIXED = struct.Struct("<4sII")  # magic, version, header length
CHECKSUM_BYTES = 32
MAX_HEADER_BYTES = 64 * 1024
MAX_JSON_BYTES = 512  # a header's JSON, counted for the disk cap (tenant names are short)
TOKEN_BYTES = 4


class StateFileError(Exception):
    """A state file that cannot be trusted (the message says why)."""


@dataclass(frozen=True)
class FileHeader:
    model: ModelKey
    tenant: str
    n_tokens: int
    n_state_bytes: int

    def file_bytes(self, header_bytes: int) -> int:
        return (
            _FIXED.size
            + header_bytes
            + self.n_tokens * TOKEN_BYTES
            + self.n_state_bytes
            + CHECKSUM_BYTES
        )


def estimated_file_bytes(entry: StateEntry) -> int:
    """A file's size for ``entry`` (the header's JSON counted at its most)."""
    return (
        _FIXED.size
        + MAX_JSON_BYTES
        + len(entry.tokens) * TOKEN_BYTES
        + entry.n_bytes
        + (CHECKSUM_BYTES)
    )


def path_for(root: Path, model: ModelKey, tenant: str, tokens: np.ndarray) -> Path:
    return root / model.digest / short_digest(tenant) / f"{tokens_digest(tokens)}{SUFFIX}"


def write_state(root: Path, entry: StateEntry, data: bytes | bytearray) -> Path:
    """Write ``entry`` with its state ``data`` (atomically, owner-only); OSError passes up."""
    path = path_for(root, entry.model, entry.tenant, entry.tokens)
    _private_dirs(root, path.parent)
    header = json.dumps(
        {
            "model_id": entry.model.model_id,
            "layout": entry.model.layout,
            "tenant": entry.tenant,
            "n_tokens": len(entry.tokens),
            "n_state_bytes": len(data),
        }
    ).encode("utf-8")
    tokens = entry.tokens.astype(TOKEN_DTYPE, copy=False).tobytes()
    chunks = (_FIXED.pack(MAGIC, VERSION, len(header)), header, tokens, data)
    temp = path.with_name(f"{path.name}{TEMP_MARK}{os.getpid()}")
    _write_new(temp, chunks)
    os.replace(temp, path)
    return path


def _private_dirs(root: Path, folder: Path) -> None:
    for directory in (root, folder.parent, folder):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if directory.stat().st_mode & 0o077:
            directory.chmod(0o700)


def _write_new(temp: Path, chunks: tuple[bytes | bytearray, ...]) -> None:
    digest = hashlib.sha256()
    descriptor = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            for chunk in chunks:
                digest.update(chunk)
                handle.write(chunk)
            handle.write(digest.digest())
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def read_header(path: Path) -> tuple[FileHeader, np.ndarray, os.stat_result]:
    """The key and tokens of a state file, checked against its size and its place, and the
    file's status (its size, its modification time: when its state was last used)."""
    with path.open("rb") as handle:
        header, header_bytes = _parse_header(handle.read(_FIXED.size), handle)
        tokens_data = handle.read(header.n_tokens * TOKEN_BYTES)
        stat = os.fstat(handle.fileno())
    if len(tokens_data) != header.n_tokens * TOKEN_BYTES:
        raise StateFileError("truncated in its tokens")
    if stat.st_size != header.file_bytes(header_bytes):
        raise StateFileError(
            f"{stat.st_size} bytes where its header promises {header.file_bytes(header_bytes)}"
        )
    tokens = as_tokens(np.frombuffer(tokens_data, dtype=TOKEN_DTYPE))
    if path != path_for(path.parents[2], header.model, header.tenant, tokens):
        raise StateFileError("its header names another model, tenant or prompt than its place")
    return header, tokens, stat


def _read_whole(path: Path) -> bytearray:
    with path.open("rb") as handle:
        raw = bytearray(os.fstat(handle.fileno()).st_size)
        if handle.readinto(raw) != len(raw):
            raise StateFileError("shorter than when it was opened")
    return raw


class _Readable(Protocol):
    def read(self, n: int, /) -> bytes: ...


def _parse_header(fixed: bytes, handle: _Readable) -> tuple[FileHeader, int]:
    if len(fixed) != _FIXED.size:
        raise StateFileError("truncated in its header")
    magic, version, header_bytes = _FIXED.unpack(fixed)
    if magic != MAGIC or version != VERSION:
        raise StateFileError(f"not a homelab state file of version {VERSION}")
    if header_bytes > MAX_HEADER_BYTES:
        raise StateFileError(f"a header of {header_bytes} bytes")
    raw = handle.read(header_bytes)
    try:
        fields = json.loads(raw)
        header = FileHeader(
            ModelKey(str(fields["model_id"]), str(fields["layout"])),
            str(fields["tenant"]),
            int(fields["n_tokens"]),
            int(fields["n_state_bytes"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise StateFileError(f"an unreadable header ({exc})") from None
    if header.n_tokens <= 0 or header.n_state_bytes <= 0:
        raise StateFileError("an empty state")
    return header, header_bytes


def read_state(entry: StateEntry, path: Path) -> memoryview:
    """The state bytes of ``entry``'s file at ``path``, after checking the checksum and the
    whole key: a writable view into the one buffer the file was read into (llama.cpp reads
    it in place)."""
    raw = _read_whole(path)
    if len(raw) < _FIXED.size + CHECKSUM_BYTES:
        raise StateFileError("truncated")
    view = memoryview(raw)
    body, checksum = view[:-CHECKSUM_BYTES], view[-CHECKSUM_BYTES:]
    if hashlib.sha256(body).digest() != checksum:
        raise StateFileError("its checksum does not match (corrupt or truncated)")
    header, header_bytes = _parse_header(bytes(body[: _FIXED.size]), _Reader(body, _FIXED.size))
    if (header.model, header.tenant) != (entry.model, entry.tenant):
        raise StateFileError("it belongs to another model, layout or tenant")
    start = _FIXED.size + header_bytes
    tokens_end = start + header.n_tokens * TOKEN_BYTES
    tokens = np.frombuffer(body[start:tokens_end], dtype=TOKEN_DTYPE)
    if not np.array_equal(tokens, entry.tokens) or len(body) - tokens_end != header.n_state_bytes:
        raise StateFileError("its tokens or size differ from what its header promised")
    return body[tokens_end:]


class _Reader:
    """``read`` over bytes already in memory."""

    def __init__(self, data: memoryview, position: int) -> None:
        self._data, self._position = data, position

    def read(self, n: int, /) -> bytes:
        chunk = bytes(self._data[self._position : self._position + n])
        self._position += n
        return chunk


def state_files(root: Path) -> Iterator[Path]:
    """Every state file (and leftover temporary file) under ``root``."""
    if not root.is_dir():
        return
    yield from sorted(root.glob(f"*/*/*{SUFFIX}*"))


def is_temporary(path: Path) -> bool:
    return TEMP_MARK in path.name


def is_abandoned(path: Path) -> bool:
    """A temporary file whose writing process is gone (a crash mid-write): safe to delete.
    Another live process's (a server writing now) never is."""
    pid_text = path.name.rpartition(TEMP_MARK)[2]
    if not pid_text.isdigit():
        return True
    pid = int(pid_text)
    return pid != os.getpid() and not psutil.pid_exists(pid)
