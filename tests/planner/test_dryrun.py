"""The llama.cpp dry run in a subprocess: its figures, and its failures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from homelab.gguf.reader import read_model
from homelab.planner.cache import kv_bytes, recurrent_bytes
from homelab.planner.dryrun import dry_run, parse_log
from homelab.settings import Settings

MIB = 1 << 20


def test_dry_run_reports_what_the_memory_model_predicts(demo_model: Callable[..., Path]) -> None:
    path = demo_model("gemma3")
    settings = Settings(n_ctx=4096, n_parallel=3, type_k="q8_0", type_v="q8_0", flash_attn=True)
    result = dry_run(path, settings)
    assert result.ok and len(result.kv_caches) == 2  # full-attention and sliding-window caches
    assert abs(result.kv_mib - kv_bytes(read_model(path), settings) / MIB) <= 0.011
    assert "CPU" in result.compute_mib and result.seconds < 1.0


def test_dry_run_of_a_recurrent_model(demo_model: Callable[..., Path]) -> None:
    path = demo_model("mamba")
    settings = Settings(n_ctx=2048, n_parallel=2)
    result = dry_run(path, settings)
    assert result.ok and not result.kv_caches
    assert result.recurrent_mib == round(recurrent_bytes(read_model(path), settings) / MIB, 2)


def test_dry_run_with_experts_kept_on_the_cpu(demo_model: Callable[..., Path]) -> None:
    result = dry_run(demo_model("moe"), Settings(n_ctx=1024, n_gpu_layers=99, n_cpu_moe=2))
    assert result.ok and result.kv_caches


def test_dry_run_failures_carry_llama_cpp_s_reason(demo_model: Callable[..., Path]) -> None:
    result = dry_run(demo_model("llama"), Settings(n_ctx=1024, type_v="q8_0", flash_attn=False))
    assert not result.ok and "flash" in (result.error or "").lower()
    missing = dry_run("/nonexistent.gguf", Settings())
    assert not missing.ok and missing.error


def test_parse_log() -> None:
    log = (
        "llama_kv_cache: size =    4.78 MiB (  1536 cells,   4 layers,  3/3 seqs), K (q8_0): ...\n"
        "sched_reserve:      CUDA0 compute buffer size =   297.00 MiB\n"
        "sched_reserve:  CUDA_Host compute buffer size =    12.01 MiB\n"
        "llama_context:  CUDA_Host  output buffer size =     0.49 MiB\n"
        "load_tensors: offloaded 33/33 layers to GPU\n"
    )
    result = parse_log(log)
    assert [(c.mib, c.cells, c.layers) for c in result.kv_caches] == [(4.78, 1536, 4)]
    assert result.compute_mib == {"CUDA0": 297.0, "CUDA_Host": 12.01}
    assert result.output_mib == {"CUDA_Host": 0.49} and result.offloaded_layers == 33
