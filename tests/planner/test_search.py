"""The joint search on catalogue models and GPU profiles (offline, no GPU needed).

Where the search claims an optimum, the tests check it by brute force with the memory model:
one step further (a better quant, one more slot, 256 more tokens) must not fit.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from planner_helpers import cpu_hardware, profile_hardware, vram_hardware

from homelab.errors import PlanError
from homelab.gguf.catalogue import find_model
from homelab.gguf.reader import read_model
from homelab.models.ref import resolve
from homelab.planner.budget import Hardware
from homelab.planner.memory import MemoryModel
from homelab.planner.plan import Plan, plan_model
from homelab.planner.search import PlanRequest, order_by_quality
from homelab.settings import Settings


def plan(model: str, hardware: Hardware, **request: object) -> Plan:
    variants = resolve(model).variants()
    return plan_model(variants, hardware, PlanRequest(**request), verify=False)  # type: ignore[arg-type]


def fits(model_slug: str, quant: str, settings: Settings, hardware: Hardware) -> bool:
    model = find_model(model_slug).model_info(quant)
    return MemoryModel(model).estimate(replace(settings, quant=quant), hardware).fits


def longer(settings: Settings, tokens: int = 256) -> Settings:
    per_slot = settings.n_ctx_per_slot + tokens
    return replace(settings, n_ctx_per_slot=per_slot, n_ctx=per_slot * settings.n_parallel)


def test_seed_view_llama_8b_q4_k_m_on_an_rtx_4090() -> None:
    result = plan("llama-3.1-8b", profile_hardware("rtx-4090"), quant="Q4_K_M")
    s = result.settings
    assert result.fits and s.quant == "Q4_K_M"
    assert s.n_gpu_layers == 33 and s.n_cpu_moe == 0
    assert s.n_ctx_per_slot == 131072 == s.n_ctx  # the trained context, one slot
    rows = {(r.type_k, r.type_v): r for r in result.capacity}
    assert set(rows) == {("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0")}
    f16, q8, q4 = (rows[k, k].max_ctx_memory for k in ("f16", "q8_0", "q4_0"))
    assert f16 < q8 < q4
    assert q8 / f16 == pytest.approx(2 / 1.0625, rel=0.08)  # compute buffers grow a little too
    assert rows["f16", "f16"].chosen  # f16 already reaches the trained context
    assert any("trained context" in reason for reason in result.reasons)


def test_goal_context_takes_the_best_quant_then_the_longest_context() -> None:
    hardware = profile_hardware("rtx-3060-12gb")
    result = plan("llama-3.1-8b", hardware)
    s = result.settings
    assert result.fits and s.n_gpu_layers == 33 and s.n_ctx_per_slot >= 4096
    quants = [m.file_type for m in order_by_quality([q for q in _variants("llama-3.1-8b")])]
    for better in quants[: quants.index(s.quant)]:
        smallest = replace(s, type_k="q4_0", type_v="q4_0", n_ctx=4096, n_ctx_per_slot=4096)
        assert not fits("llama-3.1-8b", better, smallest, hardware)
    assert not fits("llama-3.1-8b", s.quant, longer(s), hardware)
    for row in result.capacity:
        assert row.max_ctx <= s.n_ctx_per_slot or row.chosen


def _variants(slug: str) -> list:  # type: ignore[type-arg]
    entry = find_model(slug)
    return [entry.model_info(q.quant) for q in entry.quants]


def test_goal_context_keeps_all_layers_on_the_gpu_and_says_so() -> None:
    result = plan(
        "llama-3.1-8b", profile_hardware("rtx-3060-12gb"), quant="Q8_0", kv=("f16", "f16")
    )
    assert result.settings.n_gpu_layers == 33
    assert result.settings.n_ctx_per_slot < 131072
    assert any("kept every layer on the GPU" in reason for reason in result.reasons)


def test_goal_quality_prefers_the_best_quant_at_the_asked_context() -> None:
    hardware = profile_hardware("rtx-3060-12gb")
    result = plan("llama-3.1-8b", hardware, goal="quality", ctx=8192)
    s = result.settings
    assert s.n_ctx_per_slot == 8192 and s.n_gpu_layers == 33
    assert (s.type_k, s.type_v) == ("f16", "f16")
    assert s.quant == "Q8_0"


def test_goal_throughput_with_a_stated_workload() -> None:
    result = plan(
        "llama-3.1-8b", profile_hardware("rtx-4090"), goal="throughput", parallel=8, ctx=8192
    )
    s = result.settings
    assert (s.n_parallel, s.n_ctx_per_slot, s.n_ctx) == (8, 8192, 65536)
    assert result.fits and s.n_gpu_layers == 33


def test_goal_throughput_fills_the_gpu_with_slots() -> None:
    hardware = profile_hardware("rtx-4090")
    result = plan("llama-3.1-8b", hardware, goal="throughput", ctx=8192)
    s = result.settings
    assert s.n_parallel > 8
    more = replace(s, n_parallel=s.n_parallel + 1, n_ctx=s.n_ctx_per_slot * (s.n_parallel + 1))
    assert s.n_parallel == 64 or not fits("llama-3.1-8b", s.quant, more, hardware)


@pytest.mark.parametrize("goal", ["quality", "throughput"])
def test_user_fixed_knobs_are_respected(goal: str) -> None:
    result = plan(
        "llama-3.1-8b", profile_hardware("rtx-4090"), goal=goal, quant="Q6_K", kv=("q8_0", "q8_0"),
        ctx=16384, parallel=2, n_gpu_layers=20, n_ubatch=256,
    )  # fmt: skip
    s = result.settings
    assert (s.quant, s.type_k, s.type_v) == ("Q6_K", "q8_0", "q8_0")
    assert (s.n_ctx_per_slot, s.n_parallel, s.n_gpu_layers, s.n_ubatch) == (16384, 2, 20, 256)


def test_with_goal_context_the_asked_context_is_the_minimum() -> None:
    result = plan("llama-3.1-8b", profile_hardware("rtx-4090"), ctx=16384, parallel=2)
    assert result.settings.n_parallel == 2
    assert result.settings.n_ctx_per_slot >= 16384


def test_a_dense_model_too_big_for_the_gpu_is_partially_offloaded() -> None:
    result = plan("llama-3.3-70b", profile_hardware("rtx-4090"), quant="Q4_K_M")
    s = result.settings
    assert result.fits and 0 < s.n_gpu_layers < 81
    cpu, gpu = result.memory.devices
    assert cpu.weights_bytes > 10 * (1 << 30) and gpu.weights_bytes > 10 * (1 << 30)
    assert any("stay on the CPU" in reason for reason in result.reasons)
    one_more = replace(s, n_gpu_layers=s.n_gpu_layers + 1)
    assert not fits("llama-3.3-70b", "Q4_K_M", one_more, profile_hardware("rtx-4090"))


def test_moe_experts_move_to_the_cpu_before_layers_do() -> None:
    result = plan("qwen3-30b-a3b", profile_hardware("rtx-3060-12gb"), quant="Q4_K_M")
    s = result.settings
    assert s.n_gpu_layers == 49 and 0 < s.n_cpu_moe < 48
    assert any("experts" in reason for reason in result.reasons)


def test_partial_offload_does_not_pick_a_quant_that_crawls() -> None:
    result = plan("llama-3.3-70b", profile_hardware("rtx-4090"))
    assert result.settings.quant not in ("Q8_0", "Q6_K")


def test_impossible_requests_name_the_binding_device_and_what_would_fit() -> None:
    with pytest.raises(PlanError) as raised:
        plan("llama-3.3-70b", vram_hardware(8, ram_gib=16), quant="Q8_0")
    message = str(raised.value)
    assert "CUDA0" in message and "budget" in message and "host RAM" in message
    with pytest.raises(PlanError, match="What fits"):
        plan(
            "llama-3.1-8b",
            profile_hardware("rtx-3060-12gb"),
            quant="Q8_0",
            kv=("f16", "f16"),
            ctx=131072,
            n_gpu_layers=33,
        )


def test_mla_needs_equal_k_and_v_types() -> None:
    with pytest.raises(PlanError, match="MLA"):
        plan("deepseek-v3", cpu_hardware(1024), kv=("q8_0", "f16"))


def test_quantized_v_needs_flash_attention() -> None:
    with pytest.raises(PlanError, match="flash attention"):
        plan("llama-3.1-8b", profile_hardware(), kv=("q8_0", "q8_0"), flash_attn=False)
    result = plan("llama-3.1-8b", profile_hardware(), kv=("q8_0", "f16"), flash_attn=False)
    assert (result.settings.type_k, result.settings.flash_attn) == ("q8_0", False)


def test_no_iq4_nl_cache_on_cuda() -> None:
    with pytest.raises(PlanError, match="iq4_nl"):
        plan("llama-3.1-8b", profile_hardware(), kv=("iq4_nl", "iq4_nl"))


def test_head_sizes_that_are_not_whole_blocks_keep_the_cache_f16(demo_model) -> None:  # type: ignore[no-untyped-def]
    model = read_model(demo_model("llama"))
    odd = replace(model, head_dim_k=80, head_dim_v=80, source="test:head80")
    result = plan_model(odd, profile_hardware(), verify=False)
    assert (result.settings.type_k, result.settings.type_v) == ("f16", "f16")
    notes = {row.type_k: row.note for row in result.capacity}
    assert "multiples of 32" in (notes["q8_0"] or "")


def test_no_flash_attention_kernel_means_no_quantized_v(demo_model) -> None:  # type: ignore[no-untyped-def]
    model = read_model(demo_model("deepseek2"))  # MLA with 96-wide latent K: no CUDA kernel
    result = plan_model(model, profile_hardware(), verify=False)
    assert result.settings.flash_attn is False
    assert (result.settings.type_k, result.settings.type_v) == ("f16", "f16")
    assert any("no flash-attention kernel" in reason for reason in result.reasons)


def test_cpu_only_plans_put_everything_on_the_cpu() -> None:
    result = plan("llama-3.1-8b", cpu_hardware(16), quant="Q4_K_M")
    assert result.settings.n_gpu_layers == 0 and len(result.memory.devices) == 1
    assert result.fits


def test_on_the_cpu_flash_attention_is_off_unless_the_v_cache_is_quantized() -> None:
    """llama.cpp's CPU flash-attention kernel decodes at 0.4-0.6x the speed once the cache
    fills (benchmarks/RESULTS.md): a CPU-only plan keeps it for a quantized V alone."""
    cpu = cpu_hardware(16)
    plain = plan("llama-3.1-8b", cpu, quant="Q4_K_M", kv=("f16", "f16"))
    assert plain.settings.flash_attn is False
    assert any("flash attention off: every layer is on the CPU" in r for r in plain.reasons)
    quantized = plan("llama-3.1-8b", cpu, quant="Q4_K_M", kv=("q8_0", "q8_0"))
    assert quantized.settings.flash_attn is True
    asked = plan("llama-3.1-8b", cpu, quant="Q4_K_M", kv=("f16", "f16"), flash_attn=True)
    assert asked.settings.flash_attn is True
    chosen = plan("llama-3.1-8b", cpu, quant="Q4_K_M")  # the planner's own K/V choice
    assert chosen.settings.flash_attn == (chosen.settings.type_v != "f16")
    on_gpu = plan("llama-3.1-8b", profile_hardware(), kv=("f16", "f16"))
    assert on_gpu.settings.flash_attn is True and on_gpu.settings.n_gpu_layers > 0
    no_layers = plan("llama-3.1-8b", profile_hardware(), kv=("f16", "f16"), n_gpu_layers=0)
    assert no_layers.settings.flash_attn is False


def test_sliding_window_models_plan_with_swa_full_off() -> None:
    result = plan("gemma-3-12b", profile_hardware("rtx-4090"))
    assert result.settings.swa_full is False
    assert any("sliding-window" in reason for reason in result.reasons)


def test_json_document_has_the_contract_keys() -> None:
    document = plan("llama-3.1-8b", profile_hardware()).to_dict()
    assert set(document["settings"]) >= {
        "quant", "n_ctx", "n_ctx_per_slot", "n_parallel", "type_k", "type_v", "flash_attn",
        "n_gpu_layers", "n_cpu_moe", "n_ubatch", "swa_full",
    }  # fmt: skip
    memory = document["memory"]
    device_keys = {"name", "budget_bytes", "weights_bytes", "kv_bytes", "recurrent_bytes",
                   "compute_bytes", "overhead_bytes", "total_bytes"}  # fmt: skip
    assert set(memory) >= device_keys - {"name", "budget_bytes"} | {"devices"}
    assert all(set(device) >= device_keys for device in memory["devices"])
    assert sum(d["total_bytes"] for d in memory["devices"]) == memory["total_bytes"]
    assert all(set(row) >= {"type_k", "type_v", "max_ctx"} for row in document["capacity"])
    assert set(document["predicted"]) >= {"decode_tok_s", "prefill_tok_s", "basis"}
    assert document["predicted"]["basis"] == "roofline"
    assert document["verified"]["method"] == "formula"
    assert document["fits"] is True and document["reasons"]
