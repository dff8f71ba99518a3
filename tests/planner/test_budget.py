"""Budgets: what a plan may use on each device, from a profile, a size or detection."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from homelab.errors import PlanError
from homelab.hardware.build import BuildInfo
from homelab.hardware.gpu import GpuInfo
from homelab.hardware.host import CpuInfo, MemoryInfo
from homelab.hardware.profiles import find_gpu_profile
from homelab.hardware.report import HardwareReport
from homelab.planner.budget import (
    DEFAULT_GPU_OVERHEAD_BYTES,
    DEFAULT_MARGIN_BYTES,
    DESKTOP_RESERVE_BYTES,
    HOST_MARGIN_BYTES,
    hardware_from_report,
    profile_gpu,
    resolve_hardware,
    vram_gpu,
)

GIB = 1 << 30


def fake_gpu(
    index: int = 0, free_gib: float = 20.0, name: str = "NVIDIA GeForce RTX 4090"
) -> GpuInfo:
    """A GpuInfo as NVML would describe it (no GPU on the test machine)."""
    return GpuInfo(
        index=index, name=name, uuid=None, compute_capability="8.9", pcie_generation=4,
        pcie_width=16, pcie_generation_max=4, pcie_width_max=16, profile_id="rtx-4090",
        memory_total_bytes=24 * GIB, memory_free_bytes=int(free_gib * GIB),
        memory_used_bytes=24 * GIB - int(free_gib * GIB), unified_memory=False,
        temperature_c=None, power_draw_w=None, power_limit_w=None, utilization_gpu_percent=None,
        utilization_memory_percent=None, processes=(),
    )  # fmt: skip


def fake_report(gpus: tuple[GpuInfo, ...], cpu_only_build: bool = False) -> HardwareReport:
    backends = ("CPU",) if cpu_only_build else ("CUDA", "CPU")
    return HardwareReport(
        gpus=gpus, reason=None if gpus else "no GPU", driver_version=None, cuda_driver_version=None,
        cpu=CpuInfo("test CPU", "x86_64", 8, 16, 16, True, ()),
        memory=MemoryInfo(64 * GIB, 40 * GIB, 0, 0, None),
        build=BuildInfo("0.3.36", not cpu_only_build, None, backends),
        warnings=(), notes=(),
    )  # fmt: skip


def test_a_profile_gpu_keeps_a_desktop_reserve_and_a_margin() -> None:
    profile = find_gpu_profile("rtx-4090")
    device = profile_gpu(profile)
    assert device.budget_bytes == profile.vram_bytes - DESKTOP_RESERVE_BYTES - DEFAULT_MARGIN_BYTES
    assert device.overhead_bytes == profile.overhead_bytes and device.hardware_id == "rtx-4090"


def test_vram_and_margin() -> None:
    assert vram_gpu(12 * GIB, margin_bytes=GIB).budget_bytes == 11 * GIB
    assert vram_gpu(12 * GIB).overhead_bytes == DEFAULT_GPU_OVERHEAD_BYTES
    with pytest.raises(PlanError, match="no memory"):
        vram_gpu(GIB // 8)


def test_detected_gpus_plan_with_their_free_memory() -> None:
    hardware = hardware_from_report(fake_report((fake_gpu(0, 20.0), fake_gpu(1, 10.0))))
    assert [d.name for d in hardware.devices] == ["CPU", "CUDA0", "CUDA1"]
    assert hardware.gpus[0].budget_bytes == 20 * GIB - DEFAULT_MARGIN_BYTES
    assert hardware.gpu_split() == (20 * GIB, 10 * GIB)  # llama.cpp splits by free memory
    assert hardware.cpu.budget_bytes == 40 * GIB - HOST_MARGIN_BYTES


def test_a_full_gpu_and_a_cpu_only_build_are_planned_around() -> None:
    full = hardware_from_report(fake_report((fake_gpu(0, 0.5), fake_gpu(1, 20.0))))
    assert [d.name for d in full.devices] == [
        "CPU",
        "CUDA0",
    ] and "planning without it" in full.notes[0]
    cpu_build = hardware_from_report(fake_report((fake_gpu(),), cpu_only_build=True))
    assert not cpu_build.has_gpu and "CPU only" in cpu_build.notes[0]


def test_ram_override_and_cgroup_limit() -> None:
    report = fake_report(())
    assert hardware_from_report(report, ram_bytes=8 * GIB).cpu.budget_bytes == 7 * GIB
    limited = replace(report, memory=replace(report.memory, cgroup_limit_bytes=16 * GIB))
    assert hardware_from_report(limited).cpu.budget_bytes == 15 * GIB


def test_resolve_hardware_offline() -> None:
    hardware = resolve_hardware(gpu="rtx-4090", ram_bytes=32 * GIB, gpu_overhead_bytes=GIB)
    assert hardware.source == "profile" and hardware.gpus[0].overhead_bytes == GIB
    with pytest.raises(PlanError, match="either"):
        resolve_hardware(gpu="rtx-4090", vram_bytes=GIB)


def test_overhead_measured_by_earlier_loads_replaces_the_profile_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    monkeypatch.setenv("HOMELAB_HOME", str(tmp_path / "home"))  # records of other tests stay out

    from homelab.locations import data_dir, ensure_dir
    from homelab.planner.calibration import measured_gpu_overhead

    record = {
        "vram_bytes": {"0": 6 * GIB},
        "model_buffers_bytes": {"CUDA0": 4 * GIB, "CPU_Mapped": GIB},
        "kv_buffers_bytes": {"CUDA0": GIB},
        "recurrent_buffers_bytes": {},
        "compute_buffers_bytes": {"CUDA0": GIB // 4, "CUDA_Host": GIB // 8},
    }
    path = ensure_dir(data_dir()) / "calibration.jsonl"
    path.write_text(json.dumps(record) + "\n{torn line\n")
    try:
        assert measured_gpu_overhead(0) == GIB - GIB // 4
        assert measured_gpu_overhead(1) is None
        device = hardware_from_report(fake_report((fake_gpu(0, 20.0),))).gpus[0]
        assert device.overhead_bytes == GIB - GIB // 4 and "measured" in device.budget_note
    finally:
        path.unlink()
    assert measured_gpu_overhead(0, tmp_path / "missing.jsonl") is None
