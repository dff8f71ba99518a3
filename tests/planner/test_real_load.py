"""The memory model against real llama.cpp loads of every demo architecture.

Each architecture's tiny model is loaded once (for real: mmap, allocated buffers) and contexts
are created with the planner's settings over KV type × slots × context (× swa_full where the
model slides a window). llama.cpp's log is the reference:

* every ``llama_kv_cache: size = X MiB (N cells, L layers ...)`` line: cells and layers equal,
  and the planner's bytes print as the same X (the log's resolution is 0.01 MiB);
* ``llama_memory_recurrent: size = ...``: likewise;
* ``sched_reserve: CPU compute buffer size``: within 5% or 0.5 MiB;
* ``load_tensors: CPU_* model buffer size``: the planner's CPU weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from homelab.gguf.model import ModelInfo
from homelab.gguf.reader import read_model
from homelab.llamacpp.context import Context, ContextParams
from homelab.llamacpp.model import Model
from homelab.planner.cache import kv_caches, recurrent_bytes
from homelab.planner.compute import model_compute_bytes
from homelab.planner.dryrun import DryRunResult, parse_log
from homelab.planner.geometry import cache_geometry
from homelab.planner.placement import layer_devices, weight_table
from homelab.settings import Settings

MIB = 1 << 20
ARCHS = ("llama", "qwen3", "gemma3", "moe", "deepseek2", "mamba")
KV_TYPES = ("f16", "q8_0", "q4_0")
SLOTS = (1, 3)
CONTEXTS = (1000, 4096, 8192)
SWA_ARCHS = {"gemma3"}


@dataclass
class Loaded:
    info: ModelInfo
    model: Model

    @property
    def load_log(self) -> str:
        return self.model.load_log


@pytest.fixture(scope="module")
def loaded(demo_model: Callable[..., Path]) -> Iterator[Callable[[str, str], Loaded]]:
    """``loaded(arch, quant)``: the tiny model, really loaded, once per module."""
    cache: dict[tuple[str, str], Loaded] = {}

    def get(arch: str, quant: str = "F16") -> Loaded:
        if (arch, quant) not in cache:
            path = demo_model(arch, "tiny", quant)
            cache[arch, quant] = Loaded(read_model(path), Model.load(path))
        return cache[arch, quant]

    yield get
    for item in cache.values():
        item.model.close()


def create_context(loaded: Loaded, settings: Settings) -> DryRunResult:
    """Create (and free) a real context; what llama.cpp logged about its buffers."""
    with Context.create(loaded.model, ContextParams.from_settings(settings)) as context:
        return parse_log(context.creation_log)


def planned_settings(kv: str, slots: int, n_ctx: int, swa_full: bool = False) -> Settings:
    """What the planner hands llama.cpp: flash attention on, n_ubatch 512, swa_full explicit."""
    return Settings(
        n_ctx=n_ctx, n_parallel=slots, type_k=kv, type_v=kv, flash_attn=True, swa_full=swa_full
    )


def grid() -> list[Any]:
    cases = []
    for arch in ARCHS:
        kv_types = ("f16",) if arch == "mamba" else KV_TYPES
        for kv in kv_types:
            for slots in SLOTS:
                for n_ctx in CONTEXTS:
                    for swa_full in (False, True) if arch in SWA_ARCHS else (False,):
                        case_id = f"{arch}-{kv}-{slots}seq-{n_ctx}" + (
                            "-swafull" if swa_full else ""
                        )
                        cases.append(pytest.param(arch, kv, slots, n_ctx, swa_full, id=case_id))
    return cases


def mib_text(n_bytes: int) -> str:
    return f"{n_bytes / MIB:.2f}"


@pytest.mark.parametrize(("arch", "kv", "slots", "n_ctx", "swa_full"), grid())
def test_memory_model_equals_a_real_load(
    loaded: Callable[[str], Loaded], arch: str, kv: str, slots: int, n_ctx: int, swa_full: bool
) -> None:
    model = loaded(arch)
    settings = planned_settings(kv, slots, n_ctx, swa_full)
    engine = create_context(model, settings)

    predicted = kv_caches(cache_geometry(model.info), settings)
    assert [(c.cells, c.layers) for c in predicted] == [
        (c.cells, c.layers) for c in engine.kv_caches
    ]
    assert [mib_text(c.total_bytes) for c in predicted] == [
        f"{c.mib:.2f}" for c in engine.kv_caches
    ]

    if arch == "mamba":
        assert engine.recurrent_mib is not None
        assert mib_text(recurrent_bytes(model.info, settings)) == f"{engine.recurrent_mib:.2f}"
    else:
        assert engine.recurrent_mib is None and recurrent_bytes(model.info, settings) == 0

    real = engine.compute_mib["CPU"]
    formula = model_compute_bytes(model.info, settings) / MIB
    assert abs(formula - real) <= max(0.5, 0.05 * real), f"compute {formula:.2f} vs {real:.2f} MiB"


@pytest.mark.parametrize("arch", ["llama", "gemma3", "deepseek2"])
def test_flash_attention_off_f16(loaded: Callable[[str], Loaded], arch: str) -> None:
    """Without flash attention V is transposed (padded to the widest layer) and scores are f32."""
    model = loaded(arch)
    settings = Settings(n_ctx=4096, type_k="f16", type_v="f16", flash_attn=False)
    engine = create_context(model, settings)
    predicted = kv_caches(cache_geometry(model.info), settings)
    assert [mib_text(c.total_bytes) for c in predicted] == [
        f"{c.mib:.2f}" for c in engine.kv_caches
    ]
    real = engine.compute_mib["CPU"]
    formula = model_compute_bytes(model.info, settings) / MIB
    assert abs(formula - real) <= max(0.5, 0.05 * real)


def model_buffers_mib(load_log: str) -> dict[str, float]:
    import re

    pattern = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s*([\d.]+) MiB")
    return {m[1]: float(m[2]) for m in pattern.finditer(load_log)}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("quant", ["F16", "Q8_0"])
def test_weights_equal_the_model_buffer(
    loaded: Callable[[str, str], Loaded], arch: str, quant: str
) -> None:
    model = loaded(arch, quant)
    buffers = model_buffers_mib(model.load_log)
    table = weight_table(model.info)
    cpu_bytes = table.by_device(layer_devices(model.info.n_layer, 0, ()), 0, 1)[0]
    assert set(buffers) == {"CPU_Mapped"}
    assert mib_text(cpu_bytes) == f"{buffers['CPU_Mapped']:.2f}"
    assert cpu_bytes == model.info.weights_bytes


def test_repacked_copies_match_the_repack_buffer(loaded: Callable[[str, str], Loaded]) -> None:
    """On AVX2, Q4_0 block matrices kept on the CPU get an interleaved copy (CPU_REPACK)."""
    from homelab.hardware.host import read_cpu

    if not read_cpu().has_avx2:
        pytest.skip("the CPU backend repacks Q4_0 only on AVX2 machines")
    model = loaded("llama", "Q4_0")
    buffers = model_buffers_mib(model.load_log)
    repack = sum(layer.dense_repack_bytes for layer in weight_table(model.info).layers)
    assert repack > 0
    assert mib_text(repack) == f"{buffers['CPU_REPACK']:.2f}"
