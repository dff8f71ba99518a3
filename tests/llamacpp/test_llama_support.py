"""The doorway's small parts: type ids, log capture, build facts, devices, grammar, quantizer."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import gguf
import pytest

from homelab.errors import EngineError, ModelFileError
from homelab.llamacpp._lib import lib
from homelab.llamacpp.backend import build_facts
from homelab.llamacpp.devices import cpu_buffer_type, devices
from homelab.llamacpp.ggml_types import GGML_TYPE_IDS, ggml_type_id
from homelab.llamacpp.grammar import json_schema_to_gbnf
from homelab.llamacpp.log import capture_log, joined, problem_lines
from homelab.llamacpp.model import Model, ModelLoadError
from homelab.llamacpp.quantize import quantized_size_bytes
from homelab.settings import KV_TYPES


def test_type_ids_are_ggml_s_and_cover_every_cache_type() -> None:
    assert set(GGML_TYPE_IDS) == set(KV_TYPES)
    for name, type_id in GGML_TYPE_IDS.items():
        assert gguf.GGMLQuantizationType[name.upper()].value == type_id
    assert ggml_type_id("Q8_0") == 8
    with pytest.raises(EngineError, match="unknown KV cache type"):
        ggml_type_id("q3_k")


def test_nested_captures_both_see_llama_cpp_s_lines(tmp_path: Path) -> None:
    with capture_log() as outer, capture_log() as inner, pytest.raises(ModelLoadError):
        Model.load(tmp_path / "missing.gguf")
    assert inner and joined(inner) in joined(outer)


def test_captures_belong_to_their_thread(tmp_path: Path) -> None:
    seen: list[str] = []

    def load_elsewhere() -> None:
        with capture_log() as lines, pytest.raises(ModelLoadError):
            Model.load(tmp_path / "other.gguf")
        seen.append(joined(lines))

    with capture_log() as mine:
        worker = threading.Thread(target=load_elsewhere)
        worker.start()
        worker.join()
    assert "other.gguf" in seen[0] and "other.gguf" not in joined(mine)


def test_uncaptured_errors_go_to_python_logging(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    module = lib()  # a raw call outside any capture (the doorway's own calls capture)
    missing = str(tmp_path / "logged.gguf").encode()
    with caplog.at_level(logging.WARNING, logger="homelab.llama"):
        assert not module.llama_model_load_from_file(missing, module.llama_model_default_params())
    assert any("logged.gguf" in record.getMessage() for record in caplog.records)


def test_problem_lines_prefer_the_cause() -> None:
    log = "llama_model_load: loading\nggml: failed to allocate 12 GiB\nllama: done.\n"
    assert problem_lines(log) == "ggml: failed to allocate 12 GiB"
    assert problem_lines("") == "llama.cpp logged nothing"


def test_build_facts_and_devices_of_this_build() -> None:
    facts = build_facts()
    assert facts.version == "0.3.36" and "CPU" in facts.system_info
    found = devices()
    cpu = [device for device in found if device.kind == "cpu"]
    assert cpu and cpu[0].total_bytes > 0
    assert facts.gpu_offload == any(device.kind == "gpu" for device in found)
    assert cpu_buffer_type() != 0


def test_a_json_schema_becomes_a_grammar() -> None:
    grammar = json_schema_to_gbnf('{"type": "object", "properties": {"n": {"type": "integer"}}}')
    assert "root ::=" in grammar
    with pytest.raises(EngineError, match="cannot be turned into a grammar"):
        json_schema_to_gbnf('{"type": "no-such-type"}')


def test_the_quantizer_s_dry_run_gives_the_output_size(
    demo_model: Callable[..., Path], tmp_path: Path
) -> None:
    source = demo_model("llama")
    q8 = quantized_size_bytes(source, "Q8_0")
    assert 0 < q8 < source.stat().st_size
    assert quantized_size_bytes(source, "Q4_0") < q8
    with pytest.raises(ModelFileError, match="could not quantize"):
        quantized_size_bytes(tmp_path / "missing.gguf", "Q8_0")
