"""Broken GGUF files fail with a ModelFileError naming the file and the problem, quickly and
without allocating what the file claims.

Files are built byte by byte with ``struct`` from a valid minimal model (checked to load
first, so every corruption below is the only thing wrong), or cut from a real demo model.
"""

from __future__ import annotations

import mmap
import re
import struct
import time
import tracemalloc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from homelab.errors import ModelFileError
from homelab.gguf.demo import demo_model_path
from homelab.gguf.generator import write_f16_model
from homelab.gguf.header import MAX_ARRAY_ITEMS, MAX_STRING_BYTES
from homelab.gguf.reader import read_model

MAX_MEMORY_GROWTH_BYTES = 50 << 20
MAX_SECONDS = 5.0
HUGE = 1 << 60

# GGUF value types and ggml tensor types used below
UINT32, INT32, STRING, ARRAY, UINT64 = 4, 5, 8, 9, 10
F32, Q4_0 = 0, 2


def u32(value: int) -> bytes:
    return struct.pack("<I", value)


def u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def gguf_string(text: str, *, claimed_length: int | None = None) -> bytes:
    raw = text.encode()
    return u64(len(raw) if claimed_length is None else claimed_length) + raw


def kv(key: str, value_type: int, payload: bytes) -> bytes:
    return gguf_string(key) + u32(value_type) + payload


def kv_str(key: str, value: str) -> bytes:
    return kv(key, STRING, gguf_string(value))


def kv_u32(key: str, value: int) -> bytes:
    return kv(key, UINT32, u32(value))


def tensor_info(name: str, shape: Sequence[int], ggml_type: int = F32, offset: int = 0) -> bytes:
    dims = b"".join(u64(dim) for dim in shape)
    return gguf_string(name) + u32(len(shape)) + dims + u32(ggml_type) + u64(offset)


BASE_KVS = (
    kv_str("general.architecture", "llama"),
    kv_u32("llama.block_count", 1),
    kv_u32("llama.embedding_length", 32),
    kv_u32("llama.attention.head_count", 1),
)
BASE_TENSORS = (
    tensor_info("token_embd.weight", (32, 4)),
    tensor_info("x.weight", (32,), offset=512),
)
BASE_DATA_BYTES = 512 + 128


def gguf_bytes(
    *,
    magic: bytes = b"GGUF",
    version: int = 3,
    kvs: Sequence[bytes] = BASE_KVS,
    tensors: Sequence[bytes] = BASE_TENSORS,
    n_kv: int | None = None,
    n_tensors: int | None = None,
    data_bytes: int = BASE_DATA_BYTES,
    alignment: int = 32,
) -> bytes:
    """A GGUF file: by default a valid one; each argument is a way to break it."""
    head = magic + u32(version)
    head += u64(len(tensors) if n_tensors is None else n_tensors)
    head += u64(len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    padding = b"\0" * (-len(body) % alignment)
    return body + padding + b"\1" * data_bytes


def section_ends() -> tuple[int, int, int]:
    """Byte offsets where the fixed header, the key/values and the tensor infos end."""
    header_end = 4 + 4 + 8 + 8
    kv_end = header_end + sum(len(item) for item in BASE_KVS)
    return header_end, kv_end, kv_end + sum(len(item) for item in BASE_TENSORS)


def reset_peak_rss() -> bool:
    """Reset Linux's peak RSS (``VmHWM``) to the RSS now; False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


PEAK_RSS_RESETTABLE = reset_peak_rss()


def rss_high_water_bytes() -> int:
    """The peak RSS since the last reset (``VmHWM``), or failing that the RSS now."""
    if PEAK_RSS_RESETTABLE:
        found = re.search(r"^VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
        assert found is not None, "no VmHWM line in /proc/self/status"
        return int(found[1]) * 1024
    return int(psutil.Process().memory_info().rss)


@contextmanager
def bounded() -> Iterator[None]:
    """Fail if the block allocates more than ~50 MB (Python heap or RSS) or runs too long.

    RSS is measured from the RSS before the block to its peak inside it (where Linux lets the
    peak be reset; elsewhere to the RSS after it); the process's lifetime peak
    (``ru_maxrss``) would hide any growth once an earlier test had loaded a model."""
    rss_before_bytes = int(psutil.Process().memory_info().rss)
    if PEAK_RSS_RESETTABLE:
        reset_peak_rss()
    tracemalloc.start()
    started = time.monotonic()
    try:
        yield
    finally:
        elapsed_s = time.monotonic() - started
        _, peak_bytes = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    rss_growth_bytes = rss_high_water_bytes() - rss_before_bytes
    assert peak_bytes < MAX_MEMORY_GROWTH_BYTES, f"Python heap peaked at {peak_bytes:,} bytes"
    assert rss_growth_bytes < MAX_MEMORY_GROWTH_BYTES, f"RSS grew by {rss_growth_bytes:,} bytes"
    assert elapsed_s < MAX_SECONDS, f"took {elapsed_s:.1f} s"


def touch_anonymous_memory(n_bytes: int) -> None:
    """Map ``n_bytes`` outside the Python heap (tracemalloc cannot see it), write every page,
    and unmap it again: a native allocation that is gone by the end of the block."""
    mapping = mmap.mmap(-1, n_bytes)
    for offset in range(0, n_bytes, mmap.PAGESIZE):
        mapping[offset] = 1
    mapping.close()


@pytest.mark.skipif(not PEAK_RSS_RESETTABLE, reason="needs Linux's resettable peak RSS")
def test_the_bound_catches_a_native_allocation_freed_before_the_end() -> None:
    with pytest.raises(AssertionError, match="RSS grew by"), bounded():
        touch_anonymous_memory(2 * MAX_MEMORY_GROWTH_BYTES)
    with bounded():  # the same check passes when nothing much is allocated
        touch_anonymous_memory(MAX_MEMORY_GROWTH_BYTES // 10)


def assert_rejected(path: Path, *problem: str) -> ModelFileError:
    with bounded(), pytest.raises(ModelFileError) as caught:
        read_model(path)
    message = str(caught.value)
    assert str(path) in message
    for part in problem:
        assert part in message
    return caught.value


def write(tmp_path: Path, content: bytes, name: str = "model.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


def test_the_minimal_file_is_valid(tmp_path: Path) -> None:
    import gguf

    path = write(tmp_path, gguf_bytes())
    info = read_model(path)
    assert [t.name for t in info.tensors] == ["token_embd.weight", "x.weight"]
    assert info.n_params == 32 * 4 + 32
    assert len(gguf.GGUFReader(path).tensors) == 2  # the reference parser agrees


# --- the fixed header --------------------------------------------------------------------


def test_empty_file(tmp_path: Path) -> None:
    assert_rejected(write(tmp_path, b""), "truncated", "magic")


def test_bad_magic(tmp_path: Path) -> None:
    assert_rejected(write(tmp_path, gguf_bytes(magic=b"GGML")), "not a GGUF file")


@pytest.mark.parametrize("version", [0, 1, 4, 0xFFFFFFFF])
def test_unknown_version(tmp_path: Path, version: int) -> None:
    assert_rejected(
        write(tmp_path, gguf_bytes(version=version)), f"unsupported GGUF version {version}"
    )


def test_truncated_in_the_header(tmp_path: Path) -> None:
    assert_rejected(write(tmp_path, gguf_bytes()[:12]), "truncated", "tensor count")


def test_absurd_tensor_count(tmp_path: Path) -> None:
    assert_rejected(write(tmp_path, gguf_bytes(n_tensors=HUGE)), f"{HUGE:,} tensors")


def test_absurd_key_value_count(tmp_path: Path) -> None:
    assert_rejected(write(tmp_path, gguf_bytes(n_kv=HUGE)), f"{HUGE:,} metadata keys")


# --- key/values --------------------------------------------------------------------------


def test_truncated_in_the_middle_of_a_key_value(tmp_path: Path) -> None:
    header_end, _, _ = section_ends()
    cut = header_end + len(BASE_KVS[0]) - 3  # inside the architecture string's value
    assert_rejected(write(tmp_path, gguf_bytes()[:cut]), "truncated", "'general.architecture'")


def test_absurd_string_length_in_a_key(tmp_path: Path) -> None:
    broken = gguf_string("general.name", claimed_length=HUGE) + u32(STRING) + gguf_string("x")
    path = write(tmp_path, gguf_bytes(kvs=(*BASE_KVS, broken)))
    assert_rejected(path, f"claims a string of {HUGE:,} bytes")


def test_absurd_string_length_in_a_value(tmp_path: Path) -> None:
    broken = kv("general.name", STRING, gguf_string("x", claimed_length=HUGE))
    path = write(tmp_path, gguf_bytes(kvs=(*BASE_KVS, broken)))
    assert_rejected(path, "'general.name'", f"claims a string of {HUGE:,} bytes")


def test_absurd_array_length(tmp_path: Path) -> None:
    broken = kv("tokenizer.ggml.scores", ARRAY, u32(UINT32) + u64(HUGE))
    path = write(tmp_path, gguf_bytes(kvs=(*BASE_KVS, broken)))
    assert_rejected(path, "'tokenizer.ggml.scores'", f"array of {HUGE:,} items")


def test_large_but_allowed_array_in_a_short_file_is_not_allocated(tmp_path: Path) -> None:
    # 16M u64 items (128 MiB) claimed, 8 bytes present: must not allocate 128 MiB first.
    broken = kv("tokenizer.ggml.scores", ARRAY, u32(UINT64) + u64(MAX_ARRAY_ITEMS) + u64(7))
    path = write(tmp_path, gguf_bytes(kvs=(*BASE_KVS, broken), tensors=()))
    assert_rejected(path, "truncated", "'tokenizer.ggml.scores'")


def test_large_but_allowed_string_in_a_short_file_is_not_allocated(tmp_path: Path) -> None:
    broken = kv("general.name", STRING, gguf_string("abc", claimed_length=MAX_STRING_BYTES))
    path = write(tmp_path, gguf_bytes(kvs=(*BASE_KVS, broken), tensors=()))
    assert_rejected(path, "truncated", "'general.name'")


def test_nested_arrays(tmp_path: Path) -> None:
    inner = u32(UINT32) + u64(1) + u32(7)
    nested = kv("general.tags", ARRAY, u32(ARRAY) + u64(1) + inner)
    assert_rejected(write(tmp_path, gguf_bytes(kvs=(*BASE_KVS, nested))), "nested array")


def test_unknown_value_type(tmp_path: Path) -> None:
    broken = kv("general.name", 99, u32(0))
    assert_rejected(write(tmp_path, gguf_bytes(kvs=(*BASE_KVS, broken))), "unknown value type 99")


def test_duplicate_key(tmp_path: Path) -> None:
    path = write(tmp_path, gguf_bytes(kvs=(*BASE_KVS, BASE_KVS[1])))
    assert_rejected(path, "'llama.block_count' appears twice")


@pytest.mark.parametrize("alignment", [0, 24, 33])
def test_alignment_that_is_not_a_power_of_two(tmp_path: Path, alignment: int) -> None:
    path = write(tmp_path, gguf_bytes(kvs=(*BASE_KVS, kv_u32("general.alignment", alignment))))
    assert_rejected(path, f"general.alignment {alignment} is not a power of two")


# --- tensor infos ------------------------------------------------------------------------


def test_truncated_in_tensor_infos(tmp_path: Path) -> None:
    _, kv_end, _ = section_ends()
    assert_rejected(write(tmp_path, gguf_bytes()[: kv_end + 30]), "truncated", "tensor")


@pytest.mark.parametrize("shape", [(), (32, 1, 1, 1, 1)], ids=["0-dims", "5-dims"])
def test_tensor_with_wrong_number_of_dimensions(tmp_path: Path, shape: tuple[int, ...]) -> None:
    path = write(tmp_path, gguf_bytes(tensors=(tensor_info("bad", shape),)))
    assert_rejected(path, f"'bad' claims {len(shape)} dimensions")


def test_tensor_with_a_zero_dimension(tmp_path: Path) -> None:
    path = write(tmp_path, gguf_bytes(tensors=(tensor_info("bad", (32, 0)),)))
    assert_rejected(path, "'bad' has an impossible shape")


def test_unknown_tensor_type(tmp_path: Path) -> None:
    path = write(tmp_path, gguf_bytes(tensors=(tensor_info("bad", (32,), ggml_type=9999),)))
    assert_rejected(path, "'bad' has unknown type id 9999")


def test_row_not_a_multiple_of_the_block_size(tmp_path: Path) -> None:
    path = write(tmp_path, gguf_bytes(tensors=(tensor_info("bad", (33,), ggml_type=Q4_0),)))
    assert_rejected(path, "'bad' row of 33 is not a multiple of 32")


def test_misaligned_tensor_offset(tmp_path: Path) -> None:
    tensors = (BASE_TENSORS[0], tensor_info("x.weight", (32,), offset=516))
    assert_rejected(write(tmp_path, gguf_bytes(tensors=tensors)), "'x.weight'", "not aligned")


def test_out_of_range_tensor_offset(tmp_path: Path) -> None:
    tensors = (BASE_TENSORS[0], tensor_info("x.weight", (32,), offset=1 << 50))
    path = write(tmp_path, gguf_bytes(tensors=tensors))
    assert_rejected(path, "'x.weight'", f"offset {1 << 50:,}", "expected 512")


def test_overlapping_tensors(tmp_path: Path) -> None:
    tensors = (BASE_TENSORS[0], tensor_info("x.weight", (32,), offset=0))
    assert_rejected(write(tmp_path, gguf_bytes(tensors=tensors)), "'x.weight'", "out of place")


def test_duplicate_tensor_name(tmp_path: Path) -> None:
    tensors = (BASE_TENSORS[0], tensor_info("token_embd.weight", (32,), offset=512))
    assert_rejected(
        write(tmp_path, gguf_bytes(tensors=tensors)), "'token_embd.weight' appears twice"
    )


# --- tensor data -------------------------------------------------------------------------


def test_truncated_in_tensor_data(tmp_path: Path) -> None:
    path = write(tmp_path, gguf_bytes()[:-1])
    assert_rejected(path, "truncated", "'x.weight' needs bytes up to")


@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.05, 0.5, 0.999])
def test_real_model_cut_short(tmp_path: Path, fraction: float) -> None:
    # The tiny model's header (with its 1024-token vocabulary) is ~1% of the file.
    content = demo_model_path("llama").read_bytes()
    assert_rejected(write(tmp_path, content[: int(len(content) * fraction)]), "truncated")


# --- the file system ---------------------------------------------------------------------


def test_a_directory(tmp_path: Path) -> None:
    folder = tmp_path / "model.gguf"
    folder.mkdir()
    assert_rejected(folder, "is a directory")


def test_a_missing_file(tmp_path: Path) -> None:
    assert_rejected(tmp_path / "absent.gguf", "file not found")


def test_an_incomplete_split_set(tmp_path: Path) -> None:
    first = write_f16_model(tmp_path / "set.gguf", "llama", split_max_tensors=15)
    (tmp_path / "set-00002-of-00003.gguf").unlink()
    assert_rejected(first, "split set is incomplete", "set-00002-of-00003.gguf")


def test_a_lone_part_renamed_as_a_single_file(tmp_path: Path) -> None:
    first = write_f16_model(tmp_path / "set.gguf", "llama", split_max_tensors=15)
    lone = first.rename(tmp_path / "lone.gguf")
    assert_rejected(lone, "split.count says 3 parts but it was found as a single file")


def test_parts_of_a_split_set_in_the_wrong_order(tmp_path: Path) -> None:
    write_f16_model(tmp_path / "set.gguf", "llama", split_max_tensors=15)
    second, third = tmp_path / "set-00002-of-00003.gguf", tmp_path / "set-00003-of-00003.gguf"
    swap = tmp_path / "swap"
    second.rename(swap)
    third.rename(second)
    swap.rename(third)
    assert_rejected(tmp_path / "set-00001-of-00003.gguf", "part 2 has split.no 2")


def test_parts_from_different_models(tmp_path: Path) -> None:
    write_f16_model(tmp_path / "set.gguf", "llama", split_max_tensors=20)  # 20 + 19 tensors
    write_f16_model(tmp_path / "other" / "set.gguf", "qwen3", split_max_tensors=24)  # 24 + 23
    (tmp_path / "other" / "set-00002-of-00002.gguf").replace(tmp_path / "set-00002-of-00002.gguf")
    path = tmp_path / "set-00001-of-00002.gguf"
    assert_rejected(path, "declares 39 tensors but its parts hold 43")
