"""A small streaming GGUF header parser with hard bounds.

It reads only the header (key/values and tensor infos) from anything with a ``read(n)``
method — a local file, or a remote file read through HTTP range requests — and never
allocates more than the limits below, whatever the file claims. A malformed header raises
:class:`~homelab.errors.ModelFileError` naming the source and what is wrong.

GGUF v2/v3 layout: magic ``GGUF``, u32 version, u64 tensor count, u64 kv count, the
key/values, the tensor infos, padding to ``general.alignment``, then tensor data.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO, Protocol

import gguf

from homelab.errors import ModelFileError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_TENSORS = 1 << 20  # 1,048,576 tensors: far above any real model (DeepSeek-V3: ~1,100)
MAX_KV = 1 << 16
MAX_STRING_BYTES = 16 << 20  # chat templates are KBs; 16 MiB is generous
MAX_ARRAY_ITEMS = 1 << 24  # vocabularies are ~256k; 16M is generous
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_HEADER_BYTES = 1 << 30  # a header over 1 GiB is not a model header
KEPT_ARRAY_ITEMS = 4096  # arrays longer than this are summarised, not kept
READ_CHUNK_BYTES = 1 << 20  # big reads go in chunks, so a lying length never allocates much

_SCALAR_FORMATS: dict[int, str] = {
    gguf.GGUFValueType.UINT8: "<B",
    gguf.GGUFValueType.INT8: "<b",
    gguf.GGUFValueType.UINT16: "<H",
    gguf.GGUFValueType.INT16: "<h",
    gguf.GGUFValueType.UINT32: "<I",
    gguf.GGUFValueType.INT32: "<i",
    gguf.GGUFValueType.FLOAT32: "<f",
    gguf.GGUFValueType.BOOL: "<?",
    gguf.GGUFValueType.UINT64: "<Q",
    gguf.GGUFValueType.INT64: "<q",
    gguf.GGUFValueType.FLOAT64: "<d",
}


class Readable(Protocol):
    def read(self, n: int, /) -> bytes: ...


@dataclass(frozen=True)
class ArraySummary:
    """Stands in for an array too long to keep (e.g. a tokenizer's token list)."""

    item_type: int
    length: int


@dataclass(frozen=True)
class RawTensor:
    name: str
    ggml_type: int
    type_name: str
    shape: tuple[int, ...]
    n_bytes: int
    offset: int


@dataclass(frozen=True)
class RawHeader:
    """The parsed header of one GGUF file."""

    version: int
    metadata: dict[str, object]
    tensors: tuple[RawTensor, ...]
    alignment: int
    data_offset: int  # where tensor data starts in the file


class _Stream:
    """Counts bytes read and turns short reads into a clear error."""

    def __init__(self, source: Readable, label: str) -> None:
        self._source = source
        self.label = label
        self.position = 0

    def fail(self, problem: str) -> ModelFileError:
        return ModelFileError(self.label, problem, hint="Re-download the file or pick another.")

    def read(self, n: int, what: str) -> bytes:
        if self.position + n > MAX_HEADER_BYTES:
            raise self.fail(f"header larger than {MAX_HEADER_BYTES >> 20} MiB while reading {what}")
        if n <= READ_CHUNK_BYTES:
            data = self._source.read(n)
            if len(data) == n:  # the common case: one call, no copies
                self.position += n
                return data
            chunks = [data]
        else:
            chunks = []
        received = sum(len(chunk) for chunk in chunks)
        while received < n:  # short reads are legal for streams; only b"" means the end
            chunk = self._source.read(min(n - received, READ_CHUNK_BYTES))
            if not chunk:
                raise self.fail(
                    f"file is truncated: ended at byte {self.position + received} "
                    f"while reading {what}"
                )
            chunks.append(chunk)
            received += len(chunk)
        self.position += n
        return b"".join(chunks)

    def skip(self, n: int, what: str) -> None:
        """Read and drop ``n`` bytes, a chunk at a time."""
        while n > 0:
            step = min(n, READ_CHUNK_BYTES)
            self.read(step, what)
            n -= step

    def unpack(self, fmt: str, what: str) -> int | float | bool:
        value: int | float | bool = struct.unpack(fmt, self.read(struct.calcsize(fmt), what))[0]
        return value

    def u32(self, what: str) -> int:
        return int(self.unpack("<I", what))

    def u64(self, what: str) -> int:
        return int(self.unpack("<Q", what))

    def string(self, what: str) -> str:
        length = self.u64(f"length of {what}")
        if length > MAX_STRING_BYTES:
            raise self.fail(
                f"{what} claims a string of {length:,} bytes (limit {MAX_STRING_BYTES:,})"
            )
        raw = self.read(length, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="replace")


def _read_value(stream: _Stream, value_type: int, key: str) -> object:
    if value_type == gguf.GGUFValueType.STRING:
        return stream.string(f"value of {key!r}")
    if value_type == gguf.GGUFValueType.ARRAY:
        return _read_array(stream, key)
    fmt = _SCALAR_FORMATS.get(value_type)
    if fmt is None:
        raise stream.fail(f"key {key!r} has unknown value type {value_type}")
    return stream.unpack(fmt, f"value of {key!r}")


def _read_array(stream: _Stream, key: str) -> object:
    item_type = stream.u32(f"array type of {key!r}")
    length = stream.u64(f"array length of {key!r}")
    if length > MAX_ARRAY_ITEMS:
        raise stream.fail(
            f"key {key!r} claims an array of {length:,} items (limit {MAX_ARRAY_ITEMS:,})"
        )
    if item_type == gguf.GGUFValueType.ARRAY:
        raise stream.fail(f"key {key!r} is a nested array, which GGUF models do not use")
    if length <= KEPT_ARRAY_ITEMS:
        return tuple(_read_value(stream, item_type, key) for _ in range(length))
    fmt = _SCALAR_FORMATS.get(item_type)
    if fmt is not None:
        stream.skip(struct.calcsize(fmt) * length, f"array {key!r}")
    else:
        for _ in range(length):  # strings: each has its own length; keep none of them
            _read_value(stream, item_type, key)
    return ArraySummary(item_type, length)


def _tensor_bytes(stream: _Stream, name: str, ggml_type: int, shape: tuple[int, ...]) -> int:
    try:
        quant = gguf.GGMLQuantizationType(ggml_type)
        block_size, type_size = gguf.GGML_QUANT_SIZES[quant]
    except (ValueError, KeyError):
        raise stream.fail(f"tensor {name!r} has unknown type id {ggml_type}") from None
    n_elements = 1
    for dim in shape:
        n_elements *= dim
    if shape[0] % block_size:
        raise stream.fail(f"tensor {name!r} row of {shape[0]} is not a multiple of {block_size}")
    return n_elements // block_size * type_size


def _read_tensor(stream: _Stream, index: int) -> RawTensor:
    name = stream.string(f"name of tensor {index}")
    n_dims = stream.u32(f"dimensions of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise stream.fail(f"tensor {name!r} claims {n_dims} dimensions (1..{MAX_DIMS} allowed)")
    shape = tuple(stream.u64(f"shape of tensor {name!r}") for _ in range(n_dims))
    if any(dim == 0 or dim > 1 << 40 for dim in shape):
        raise stream.fail(f"tensor {name!r} has an impossible shape {shape}")
    ggml_type = stream.u32(f"type of tensor {name!r}")
    offset = stream.u64(f"offset of tensor {name!r}")
    n_bytes = _tensor_bytes(stream, name, ggml_type, shape)
    type_name = gguf.GGMLQuantizationType(ggml_type).name
    return RawTensor(name, ggml_type, type_name, shape, n_bytes, offset)


def _read_metadata(stream: _Stream, n_kv: int) -> dict[str, object]:
    metadata: dict[str, object] = {}
    for index in range(n_kv):
        key = stream.string(f"key {index}")
        if key in metadata:
            raise stream.fail(f"metadata key {key!r} appears twice")
        metadata[key] = _read_value(stream, stream.u32(f"type of {key!r}"), key)
    return metadata


def _read_tensors(stream: _Stream, n_tensors: int) -> tuple[RawTensor, ...]:
    tensors: dict[str, RawTensor] = {}
    for index in range(n_tensors):
        tensor = _read_tensor(stream, index)
        if tensor.name in tensors:
            raise stream.fail(f"tensor {tensor.name!r} appears twice")
        tensors[tensor.name] = tensor
    return tuple(tensors.values())


def parse_header(source: Readable | BinaryIO, label: str) -> RawHeader:
    """Parse a GGUF header from ``source`` (positioned at byte 0). ``label`` names it in errors."""
    stream = _Stream(source, label)
    magic = stream.read(4, "magic")
    if magic != MAGIC:
        raise stream.fail(f"not a GGUF file (magic {magic!r}, expected b'GGUF')")
    version = stream.u32("version")
    if version not in SUPPORTED_VERSIONS:
        raise stream.fail(f"unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = stream.u64("tensor count")
    n_kv = stream.u64("key/value count")
    if n_tensors > MAX_TENSORS:
        raise stream.fail(f"header claims {n_tensors:,} tensors (limit {MAX_TENSORS:,})")
    if n_kv > MAX_KV:
        raise stream.fail(f"header claims {n_kv:,} metadata keys (limit {MAX_KV:,})")
    metadata = _read_metadata(stream, n_kv)
    tensors = _read_tensors(stream, n_tensors)
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise stream.fail(f"general.alignment {alignment!r} is not a power of two")
    _check_layout(stream, tensors, alignment)
    data_offset = -(-stream.position // alignment) * alignment
    return RawHeader(version, metadata, tensors, alignment, data_offset)


def _check_layout(stream: _Stream, tensors: tuple[RawTensor, ...], alignment: int) -> None:
    """Tensor data must be packed in order, each one padded to the alignment (as llama.cpp
    requires): anything else is a corrupt header, not a short file."""
    expected = 0
    for tensor in tensors:
        if tensor.offset != expected:
            problem = "is not aligned" if tensor.offset % alignment else "is out of place"
            raise stream.fail(
                f"tensor {tensor.name!r} data offset {tensor.offset:,} {problem} "
                f"(expected {expected:,}; llama.cpp would refuse this file)"
            )
        expected += -(-tensor.n_bytes // alignment) * alignment


def check_data_fits(header: RawHeader, file_bytes: int, label: str) -> None:
    """Raise if the tensor data the header describes runs past the end of the file."""
    for tensor in header.tensors:
        end = header.data_offset + tensor.offset + tensor.n_bytes
        if end > file_bytes:
            raise ModelFileError(
                label,
                f"file is truncated: tensor {tensor.name!r} needs bytes up to {end:,} "
                f"but the file has {file_bytes:,}",
                hint="The download was probably interrupted; download it again.",
            )
