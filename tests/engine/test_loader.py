"""Loading applies the plan's settings exactly and steps down the OOM ladder on real failures."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from engine_helpers import EngineFactory, tiny_settings

from homelab.engine.api import GenerationRequest, SamplingParams
from homelab.engine.calibration import read_records
from homelab.engine.engine import Engine
from homelab.engine.loader import ladder, load_model, parse_buffers
from homelab.errors import EngineError, ModelFileError, OutOfMemoryError
from homelab.gguf.reader import read_model
from homelab.llamacpp.model import expert_override_patterns

MIB = 1024 * 1024


def test_context_and_slots_are_exactly_as_planned(make_engine: EngineFactory) -> None:
    engine = make_engine(n_parallel=3, ctx_per_slot=512)

    def read_context() -> tuple[int, int, int, int, int]:
        ctx = engine.context
        return (ctx.n_ctx, ctx.n_ctx_per_seq, ctx.n_seq_max, ctx.n_batch, ctx.n_ubatch)

    assert engine.run_on_engine_thread(read_context).result(5) == (1536, 512, 3, 512, 256)
    assert engine.n_ctx_per_slot == 512 and engine.n_slots == 3
    report = engine.load_report
    assert report.succeeded_rung == "as planned" and not report.stepped_down
    assert report.buffers.kv == {
        "CPU": 1536 * 4 * 2 * 2 * 64 * 2
    }  # cells·layers·(K+V)·kv heads·dim·f16
    assert sum(report.buffers.model.values()) > 0 and sum(report.buffers.compute.values()) > 0


def test_quantized_kv_cache_with_flash_attention(make_engine: EngineFactory) -> None:
    f16 = make_engine(n_parallel=1, ctx_per_slot=1024)
    q8 = make_engine(n_parallel=1, ctx_per_slot=1024, type_k="q8_0", type_v="q8_0", flash_attn=True)
    expected = f16.load_report.buffers.kv["CPU"] * 34 // 64  # q8_0: 34 bytes per 32 values
    assert q8.load_report.buffers.kv["CPU"] == pytest.approx(expected, abs=0.01 * MIB)  # log rounds
    done = q8.submit(GenerationRequest("a", "hello", SamplingParams(max_tokens=4))).collect()
    assert done.finish.reason == "length"


def test_sliding_window_cache_follows_swa_full(make_engine: EngineFactory) -> None:
    small = make_engine("gemma3", n_parallel=1, ctx_per_slot=2048, swa_full=False)
    full = make_engine("gemma3", n_parallel=1, ctx_per_slot=2048, swa_full=True)
    assert sum(small.load_report.buffers.kv.values()) < sum(full.load_report.buffers.kv.values())


def test_moe_experts_can_be_kept_on_the_cpu(make_engine: EngineFactory) -> None:
    engine = make_engine("moe", n_parallel=1, n_cpu_moe=2)
    assert engine.settings.n_cpu_moe == 2
    assert expert_override_patterns(2) == [
        r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps",
        r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps",
    ]
    assert engine.submit(GenerationRequest("a", "hi", SamplingParams(max_tokens=3))).collect().text


def test_a_quantized_v_cache_without_flash_attention_fails_without_stepping_down(
    demo_model: Callable[..., Path],
) -> None:
    settings = tiny_settings(1, 512, type_v="q8_0", flash_attn=False)
    with pytest.raises(EngineError) as raised:
        load_model(demo_model("llama"), settings)
    assert not isinstance(raised.value, OutOfMemoryError)
    assert "requires flash_attn" in str(raised.value)  # llama.cpp's own reason is passed on


def test_missing_file_is_a_model_file_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError):
        load_model(tmp_path / "nope.gguf", tiny_settings())


def test_ladder_order(demo_model: Callable[..., Path]) -> None:
    info = read_model(demo_model("moe"))
    planned = replace(tiny_settings(2, 4096), n_gpu_layers=-1)
    rungs = [
        (rung, s.n_ctx_per_slot, s.type_k, s.n_cpu_moe, s.n_gpu_layers)
        for rung, s, _ in ladder(planned, info)
    ]
    assert rungs == [
        ("as planned", 4096, "f16", 0, -1),
        ("context", 2048, "f16", 0, -1),
        ("context", 1024, "f16", 0, -1),
        ("kv-type", 1024, "q8_0", 0, -1),
        ("kv-type", 1024, "q4_0", 0, -1),
        ("experts", 1024, "q4_0", info.n_layer, -1),
        ("gpu-layers", 1024, "q4_0", info.n_layer, (info.n_layer + 1) // 2),
        ("gpu-layers", 1024, "q4_0", info.n_layer, (info.n_layer + 1) // 4),
        ("gpu-layers", 1024, "q4_0", info.n_layer, 0),
    ]


# A real out-of-memory: the loader runs in a child process whose address space is capped
# (RLIMIT_AS), so llama.cpp's allocations genuinely fail above the cap.
LADDER_SCRIPT = """
import json, resource, sys
from homelab.llamacpp.backend import supports_gpu_offload
supports_gpu_offload()  # loads llama.cpp's libraries before the address space is capped
from homelab.engine.loader import load_model
from homelab.gguf.reader import read_model
from homelab.settings import Settings
path, headroom_mib = sys.argv[1], int(sys.argv[2])
info = read_model(path)
status = open("/proc/self/status").read()
vm_bytes = int(status.split("VmSize:")[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm_bytes + headroom_mib * 2**20, resource.RLIM_INFINITY))
settings = Settings(n_ctx=1 << 18, n_ctx_per_slot=1 << 18, n_parallel=1, n_threads=1,
                    n_batch=16, n_ubatch=16)
loaded = load_model(path, settings, info=info)
report = loaded.report
print(json.dumps({"steps": [[s.rung, s.ok, s.settings.n_ctx, s.settings.type_k, s.reason]
                            for s in report.steps], "summary": report.summary()}))
"""


def _run_capped(path: Path, headroom_mib: int) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", LADDER_SCRIPT, str(path), str(headroom_mib)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    ("headroom_mib", "rung", "n_ctx", "kv_types"),
    [(200, "context", 1 << 16, ("f16",)), (100, "kv-type", 1 << 16, ("q8_0", "q4_0"))],
)
def test_out_of_memory_steps_down_the_ladder(
    demo_model: Callable[..., Path],
    headroom_mib: int,
    rung: str,
    n_ctx: int,
    kv_types: tuple[str, ...],
) -> None:
    outcome = _run_capped(demo_model("llama"), headroom_mib)
    steps = outcome["steps"]
    assert isinstance(steps, list)
    *failed, (last_rung, ok, last_ctx, last_type, _) = steps
    assert ok and last_rung == rung and last_ctx == n_ctx and last_type in kv_types
    assert failed and all(not step[1] and "allocate" in step[4] for step in failed)
    assert failed[0][0] == "as planned"
    assert f"stepping down to '{rung}'" in str(outcome["summary"])


def test_buffer_lines_are_summed_per_kind_and_device() -> None:
    log = (
        "load_tensors:   CPU_Mapped model buffer size =    16.50 MiB\n"
        "load_tensors:        CUDA0 model buffer size =  1024.00 MiB\n"
        "llama_kv_cache:        CUDA0 KV buffer size =     2.00 MiB\n"
        "llama_kv_cache:        CUDA0 KV buffer size =     6.00 MiB\n"
        "llama_memory_recurrent:        CPU RS buffer size =     0.59 MiB\n"
        "sched_reserve:        CPU compute buffer size =    23.51 MiB\n"
    )
    sizes = parse_buffers(log)
    assert sizes.model == {"CPU_Mapped": round(16.5 * MIB), "CUDA0": 1024 * MIB}
    assert sizes.kv == {"CUDA0": 8 * MIB}
    assert sizes.recurrent == {"CPU": round(0.59 * MIB)}
    assert sizes.compute == {"CPU": round(23.51 * MIB)}


def test_each_load_writes_a_calibration_record(demo_model: Callable[..., Path]) -> None:
    before = len(read_records())
    predicted = {"kv_bytes": 123, "total_bytes": 456}
    with Engine.load(demo_model("llama"), tiny_settings(2, 512), predicted=predicted) as engine:
        report = engine.load_report
    records = read_records()
    assert len(records) == before + 1
    record = records[-1]
    assert record.predicted == predicted
    assert record.settings == report.settings.to_dict()
    assert record.kv_buffers_bytes == report.buffers.kv
    assert record.model_name == engine.model_info.name
    assert record.vram_bytes is None  # CPU only
    assert record.llama_total_bytes == report.buffers.total_bytes()
    assert record.ladder_rung == "as planned"
