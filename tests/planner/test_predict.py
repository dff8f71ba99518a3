"""Predicted speed: the roofline, and measured profiles replacing it."""

from __future__ import annotations

import json
from dataclasses import replace

from planner_helpers import profile_hardware

from homelab.gguf.catalogue import find_model
from homelab.locations import data_dir, ensure_dir
from homelab.planner.memory import MemoryModel
from homelab.planner.predict import load_measured_profile, predict_speed, roofline_decode_tok_s
from homelab.settings import Settings

MODEL = find_model("llama-3.1-8b").model_info("Q4_K_M")
FULL = Settings(quant="Q4_K_M", n_ctx=32768, n_ctx_per_slot=32768, flash_attn=True, n_gpu_layers=33)


def test_roofline_decode_is_bandwidth_over_bytes_read() -> None:
    hardware = profile_hardware("rtx-4090")
    memory = MemoryModel(MODEL)
    speed = roofline_decode_tok_s(memory, FULL, hardware, fill_tokens=0)
    gpu = hardware.gpus[0]
    gpu_weights = memory.estimate(FULL, hardware).device("CUDA0").weights_bytes
    assert speed == pytest_approx(gpu.bandwidth_gb_s * 1e9 * 0.75 / gpu_weights)
    assert roofline_decode_tok_s(memory, FULL, hardware, 32768) < speed  # KV is read too
    partial = replace(FULL, n_gpu_layers=20)
    assert roofline_decode_tok_s(memory, partial, hardware, 0) < speed / 2  # CPU layers are slow


def pytest_approx(value: float) -> object:
    import pytest

    return pytest.approx(value, rel=0.02)


def test_measured_profiles_replace_the_roofline() -> None:
    hardware = profile_hardware("rtx-4090")
    folder = ensure_dir(data_dir() / "profiles")
    record = {
        "model_name": MODEL.name, "quant": "Q4_K_M", "type_k": "f16", "hardware_id": "rtx-4090",
        "decode_tok_s": 123.4, "prefill_tok_s": 4567.0,
    }  # fmt: skip
    path = folder / "llama-test.json"
    path.write_text(json.dumps(record))
    try:
        measured = load_measured_profile(MODEL.name, FULL, hardware)
        assert measured is not None and measured.decode_tok_s == 123.4
        prediction = predict_speed(MemoryModel(MODEL), FULL, hardware)
        assert (prediction.basis, prediction.decode_tok_s, prediction.prefill_tok_s) == (
            "measured",
            123.4,
            4567.0,
        )
        other_kv = replace(FULL, type_k="q8_0", type_v="q8_0")
        assert predict_speed(MemoryModel(MODEL), other_kv, hardware).basis == "roofline"
        assert load_measured_profile(MODEL.name, FULL, profile_hardware("rtx-3090")) is None
    finally:
        path.unlink()


def test_broken_profile_files_are_ignored() -> None:
    folder = ensure_dir(data_dir() / "profiles")
    path = folder / "broken.json"
    path.write_text("{not json")
    try:
        assert load_measured_profile(MODEL.name, FULL, profile_hardware()) is None
    finally:
        path.unlink()
