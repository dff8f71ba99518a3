"""Our streaming header parser agrees with the ``gguf`` package's GGUFReader, on every demo
model, read from a file or from a stream that returns a few bytes at a time; split sets
combine correctly and llama.cpp runs them."""

from __future__ import annotations

import io
from itertools import islice
from pathlib import Path

import gguf
import llama_cpp  # its high-level API, as an independent judge of the split set
import pytest

from homelab.gguf.demo import demo_model_path
from homelab.gguf.generator import ARCHS, write_f16_model
from homelab.gguf.header import ArraySummary, RawHeader, parse_header
from homelab.gguf.reader import read_model

VARIANTS = [(arch, "F16") for arch in ARCHS] + [
    ("llama", "Q8_0"),
    ("llama", "Q4_0"),
    ("llama", "Q4_K_M"),
    ("gemma3", "Q4_K_M"),
    ("deepseek2", "Q4_K_M"),
]
PSEUDO_FIELDS = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}


class TrickleReader:
    """A stream whose ``read(n)`` returns at most 7 bytes, as sockets and pipes may."""

    def __init__(self, data: bytes) -> None:
        self._stream = io.BytesIO(data)

    def read(self, n: int, /) -> bytes:
        return self._stream.read(min(n, 7))


def reference_value(field: gguf.ReaderField) -> object:
    if field.types[0] == gguf.GGUFValueType.ARRAY:
        return tuple(field.contents())
    return field.contents()


def assert_headers_agree(ours: RawHeader, reference: gguf.GGUFReader) -> None:
    fields = {name: f for name, f in reference.fields.items() if name not in PSEUDO_FIELDS}
    assert list(ours.metadata) == list(fields)
    for key, field in fields.items():
        value = ours.metadata[key]
        if isinstance(value, ArraySummary):
            assert value.length == len(field.data), key
            assert value.item_type == field.types[1], key
        else:
            assert value == reference_value(field), key
    assert ours.alignment == reference.alignment
    assert ours.data_offset == reference.data_offset
    assert [
        (t.name, t.ggml_type, t.shape, t.n_bytes, ours.data_offset + t.offset) for t in ours.tensors
    ] == [
        (t.name, int(t.tensor_type), tuple(int(d) for d in t.shape), int(t.n_bytes), t.data_offset)
        for t in reference.tensors
    ]


@pytest.mark.parametrize(("arch", "quant"), VARIANTS, ids=[f"{a}-{q}" for a, q in VARIANTS])
def test_header_parser_agrees_with_gguf_reader(arch: str, quant: str) -> None:
    path = demo_model_path(arch, quant=quant)
    with path.open("rb") as handle:
        ours = parse_header(handle, str(path))
    assert_headers_agree(ours, gguf.GGUFReader(path))


def test_short_reads_from_a_stream_give_the_same_header() -> None:
    path = demo_model_path("deepseek2")
    with path.open("rb") as handle:
        from_file = parse_header(handle, str(path))
    assert parse_header(TrickleReader(path.read_bytes()), "stream") == from_file


def test_model_info_matches_the_header() -> None:
    path = demo_model_path("moe", quant="Q4_K_M")
    info = read_model(path)
    reference = gguf.GGUFReader(path)
    assert info.file_bytes == path.stat().st_size
    assert info.n_params == sum(int(t.n_elements) for t in reference.tensors)
    assert info.weights_bytes == sum(int(t.n_bytes) for t in reference.tensors)
    assert info.architecture == "llama" and info.n_expert == 4 and info.file_type == "Q4_K_M"


# --- split sets --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def split_set(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("split")
    first = write_f16_model(folder / "demo.gguf", "llama", split_max_tensors=10)
    parts = sorted(folder.glob("demo-*-of-*.gguf"))
    assert parts[0] == first
    return parts


def test_split_set_reads_as_one_model(split_set: list[Path]) -> None:
    single = read_model(demo_model_path("llama"))
    combined = read_model(split_set[0])
    assert [p.name for p in split_set] == [f"demo-{i:05d}-of-00004.gguf" for i in range(1, 5)]
    assert combined.n_files == 4
    assert combined.file_bytes == sum(p.stat().st_size for p in split_set)
    assert [(t.name, t.type_name, t.shape, t.n_bytes) for t in combined.tensors] == [
        (t.name, t.type_name, t.shape, t.n_bytes) for t in single.tensors
    ]
    assert combined.n_params == single.n_params
    assert combined.n_layer == single.n_layer and combined.n_vocab == single.n_vocab
    assert combined.metadata["split.count"] == 4


def test_any_part_names_the_whole_set(split_set: list[Path]) -> None:
    assert read_model(split_set[2]).source == str(split_set[0])


def test_each_part_agrees_with_gguf_reader(split_set: list[Path]) -> None:
    for part in split_set:
        with part.open("rb") as handle:
            assert_headers_agree(parse_header(handle, str(part)), gguf.GGUFReader(part))


def test_llama_cpp_runs_the_split_set_like_the_single_file(split_set: list[Path]) -> None:
    def greedy(path: Path) -> list[int]:
        model = llama_cpp.Llama(str(path), n_ctx=256, verbose=False)
        try:
            prompt = model.tokenize(b"hello world", add_bos=True)
            return list(islice(model.generate(prompt, temp=0.0), 8))
        finally:
            model.close()

    assert greedy(split_set[0]) == greedy(demo_model_path("llama"))
