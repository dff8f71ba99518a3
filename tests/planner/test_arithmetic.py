"""The memory arithmetic on its own: padding, rows, catalogue models' KV sizes, placement."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest
from planner_helpers import GIB, cpu_hardware, profile_hardware

from homelab.errors import PlanError
from homelab.gguf.catalogue import find_model
from homelab.gguf.reader import read_model
from homelab.planner.cache import context_shape, kv_bytes, kv_caches, recurrent_bytes, row_bytes
from homelab.planner.geometry import cache_geometry
from homelab.planner.memory import MemoryModel
from homelab.planner.placement import layer_devices, weight_table
from homelab.planner.plan import capacity_table
from homelab.settings import Settings


def test_context_is_padded_per_sequence_and_can_round_up() -> None:
    shape = context_shape(Settings(n_ctx=4096, n_parallel=3))
    assert (shape.n_ctx, shape.n_ctx_seq, shape.n_stream) == (4608, 1536, 3)
    unified = context_shape(Settings(n_ctx=4096, n_parallel=3, kv_unified=True))
    assert (unified.n_ctx, unified.n_ctx_seq, unified.n_stream) == (4096, 4096, 1)
    assert context_shape(Settings(n_ctx=1000)).n_ctx == 1024


def test_small_contexts_cap_the_batch() -> None:
    shape = context_shape(Settings(n_ctx=300, n_ubatch=512))
    assert (shape.n_batch, shape.n_ubatch, shape.n_tokens_reserve) == (300, 300, 300)


@pytest.mark.parametrize(
    ("cache_type", "expected"),
    [("f16", 256), ("bf16", 256), ("q8_0", 136), ("q4_0", 72), ("f32", 512)],
)
def test_row_bytes_of_128_values(cache_type: str, expected: int) -> None:
    assert row_bytes(cache_type, 128) == expected


def test_quantized_rows_must_be_whole_blocks() -> None:
    with pytest.raises(PlanError, match="multiple of 32"):
        row_bytes("q8_0", 80)


def test_llama_31_8b_at_32k_tokens_with_f16_kv_is_exactly_4_gib() -> None:
    model = find_model("llama-3.1-8b").model_info("Q4_K_M")
    assert kv_bytes(model, Settings(n_ctx=32768)) == 4 * GIB
    assert (
        kv_bytes(model, Settings(n_ctx=32768, type_k="q8_0", type_v="q8_0", flash_attn=True))
        == 4 * GIB * 34 // 64
    )


def test_mla_stores_k_only_and_q8_0_buys_2_over_1_0625_the_context() -> None:
    model = find_model("deepseek-v3").model_info("Q4_K_M")
    geometry = cache_geometry(model)
    assert geometry.mla and set(geometry.v_width) == {0}
    f16 = kv_bytes(model, Settings(n_ctx=16384))
    q8 = kv_bytes(model, Settings(n_ctx=16384, type_k="q8_0", type_v="q8_0", flash_attn=True))
    assert Fraction(f16, q8) == Fraction(2) / Fraction(17, 16)
    assert f16 == 61 * 16384 * 576 * 2  # one 576-wide latent row per layer and token


def test_mla_capacity_table_ratio() -> None:
    """On the CPU the capacity ratio is the KV ratio, less the attention masks (which also grow
    with the context, about 1.5% here); on CUDA, f16 copies of a quantized cache cut it more."""
    model = find_model("deepseek-v3").model_info("Q4_K_M")
    settings = Settings(n_ctx=256, n_ctx_per_slot=256, flash_attn=True)
    fixed = MemoryModel(model).estimate(settings, cpu_hardware(1024)).total_bytes
    hardware = cpu_hardware(int((fixed + 30 * GIB) / GIB))
    rows = {row.type_k: row for row in capacity_table(model, settings, hardware)}
    ratio = rows["q8_0"].max_ctx_memory / rows["f16"].max_ctx_memory
    assert ratio == pytest.approx(2 / 1.0625, rel=0.02)
    assert rows["f16"].max_ctx_memory > 200_000


def test_sliding_window_layers_keep_only_the_window() -> None:
    model = find_model("gemma-3-12b").model_info("Q4_K_M")
    settings = Settings(n_ctx=32768, flash_attn=True)
    full, swa = kv_caches(cache_geometry(model), settings)
    assert (full.cells, full.layers) == (32768, 8)
    assert (swa.cells, swa.layers) == (1536, 40)  # pad256(1024 + 512)
    row = 8 * 256 * 2  # 8 KV heads × 256 wide × f16, for K and for V
    assert full.total_bytes == 8 * 32768 * 2 * row and swa.total_bytes == 40 * 1536 * 2 * row
    everything = kv_caches(cache_geometry(model), replace(settings, swa_full=True))
    assert everything[1].cells == 32768


def test_unified_and_per_sequence_caches_hold_the_same_bytes() -> None:
    model = find_model("qwen3-8b").model_info("Q4_K_M")
    split = kv_bytes(model, Settings(n_ctx=8192, n_parallel=4))
    unified = kv_bytes(model, Settings(n_ctx=8192, n_parallel=4, kv_unified=True))
    assert split == unified


def test_recurrent_state_is_per_sequence_and_independent_of_context(demo_model) -> None:  # type: ignore[no-untyped-def]
    model = read_model(demo_model("mamba"))
    one = recurrent_bytes(model, Settings(n_ctx=1024))
    assert one == recurrent_bytes(model, Settings(n_ctx=8192))
    assert recurrent_bytes(model, Settings(n_ctx=8192, n_parallel=3)) == 3 * one
    d_conv, d_inner, d_state = 4, 512, 16
    assert one == model.n_layer * 4 * ((d_conv - 1) * d_inner + d_state * d_inner)
    assert kv_bytes(model, Settings(n_ctx=8192)) == 0


def test_multi_token_prediction_layers_get_no_cache_and_no_weights() -> None:
    entry = find_model("glm-4.5-air")
    model = entry.model_info(entry.quants[-1].quant)
    geometry = cache_geometry(model)
    assert entry.n_layer_nextn > 0
    assert len(geometry.kv_layers) == model.n_layer - entry.n_layer_nextn
    table = weight_table(model)
    assert len(table.layers) == model.n_layer - entry.n_layer_nextn
    assert table.total_bytes < model.weights_bytes


def test_output_head_is_offloaded_first() -> None:
    assert layer_devices(4, 1, (1.0,)) == (0, 0, 0, 0, 1)
    assert layer_devices(4, 3, (1.0,)) == (0, 0, 1, 1, 1)
    assert layer_devices(4, 5, (1.0,)) == (1, 1, 1, 1, 1)
    assert layer_devices(4, 0, (1.0,)) == (0,) * 5
    assert layer_devices(4, 99, ()) == (0,) * 5


def test_two_gpus_share_layers_by_their_split() -> None:
    assert layer_devices(7, 8, (1.0, 1.0)) == (1, 1, 1, 1, 2, 2, 2, 2)
    assert layer_devices(7, 8, (3.0, 1.0)) == (1, 1, 1, 1, 1, 1, 2, 2)


def test_tied_output_head_copies_the_embeddings_to_the_gpu() -> None:
    entry = next(
        e for e in (find_model("gemma-3-12b"), find_model("qwen3-8b")) if e.tied_embeddings
    )
    model = entry.model_info("Q4_K_M")
    table = weight_table(model)
    embeddings = next(t.n_bytes for t in model.tensors if t.name == "token_embd.weight")
    assert table.tied_output_bytes == embeddings
    on_gpu = table.by_device(layer_devices(model.n_layer, model.n_layer + 1, (1.0,)), 0, 2)
    assert sum(on_gpu) == table.total_bytes + embeddings


def test_n_cpu_moe_moves_only_expert_tensors() -> None:
    model = find_model("qwen3-30b-a3b").model_info("Q4_K_M")
    table = weight_table(model)
    devices = layer_devices(model.n_layer, model.n_layer + 1, (1.0,))
    none = table.by_device(devices, 0, 2)
    some = table.by_device(devices, 10, 2)
    moved = sum(layer.expert_bytes for layer in table.layers[:10])
    assert some[0] - none[0] == moved == none[1] - some[1]
    assert moved > 0


def test_estimate_puts_each_layers_cache_on_its_device() -> None:
    model = find_model("llama-3.1-8b").model_info("Q4_K_M")
    memory = MemoryModel(model)
    settings = Settings(n_ctx=8192, n_ctx_per_slot=8192, flash_attn=True, n_gpu_layers=17)
    estimate = memory.estimate(settings, profile_hardware())
    per_layer = kv_bytes(model, settings) // model.n_layer
    assert estimate.device("CUDA0").kv_bytes == 16 * per_layer  # output + blocks 16..31
    assert estimate.device("CPU").kv_bytes == 16 * per_layer
