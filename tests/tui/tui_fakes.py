"""Fixed hardware for TUI tests.

FakeHardware exists because neither a GPU nor a fixed CPU/RAM can exist on the machines the
tests run on: snapshots must render the same bytes everywhere (CPU model, RAM, a 24 GB GPU with
another process on it), and live sensor numbers must not vary.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from homelab.hardware.build import BuildInfo
from homelab.hardware.gpu import GpuInfo, GpuProcess
from homelab.hardware.host import CpuInfo, MemoryInfo
from homelab.hardware.report import HardwareReport
from homelab.tui.hardware_source import LiveHardware, live_from_report

GIB = 1 << 30
MIB = 1 << 20

FAKE_CPU = CpuInfo(
    model="Fake 8-core x86-64 CPU",
    architecture="x86_64",
    physical_cores=8,
    logical_cores=16,
    usable_cores=16,
    has_avx2=True,
    avx512_flags=(),
)
FAKE_MEMORY = MemoryInfo(
    ram_total_bytes=32 * GIB,
    ram_available_bytes=24 * GIB,
    swap_total_bytes=0,
    swap_used_bytes=0,
    cgroup_limit_bytes=None,
)
CPU_BUILD = BuildInfo("0.3.36", False, "CPU : SSE3 = 1 | AVX2 = 1", ("CPU",))
CUDA_BUILD = BuildInfo("0.3.36", True, "CUDA : ARCHS = 890 | CPU : AVX2 = 1", ("CUDA", "CPU"))
NO_DRIVER_REASON = (
    "no NVIDIA GPU: NVML library not found (libnvidia-ml.so.1) — no NVIDIA driver is "
    "installed, or this container was started without the NVIDIA runtime "
    "(`docker run --gpus all`). Running CPU-only."
)


def fake_rtx_24gb(*, ours_bytes: int = 0) -> GpuInfo:
    """A 24 GB card with a desktop session (800 MiB) on it, and optionally us."""
    processes = [GpuProcess(4242, "Xorg", 800 * MIB, "graphics")]
    if ours_bytes:
        processes.insert(0, GpuProcess(os.getpid(), "python", ours_bytes, "compute"))
    used = 300 * MIB + sum(p.used_memory_bytes or 0 for p in processes)  # + driver reserve
    total = 24 * GIB
    return GpuInfo(
        index=0,
        name="NVIDIA GeForce RTX 4090",
        uuid="GPU-FAKE-0000",
        compute_capability="8.9",
        pcie_generation=4,
        pcie_width=16,
        pcie_generation_max=4,
        pcie_width_max=16,
        profile_id="rtx-4090",
        memory_total_bytes=total,
        memory_free_bytes=total - used,
        memory_used_bytes=used,
        unified_memory=False,
        temperature_c=45,
        power_draw_w=60.0,
        power_limit_w=450.0,
        utilization_gpu_percent=3,
        utilization_memory_percent=1,
        processes=tuple(processes),
    )


@dataclass
class FakeHardware:
    """A HardwareSource with fixed answers; counts how often it was sampled."""

    report: HardwareReport
    samples: int = 0

    def detect(self) -> HardwareReport:
        return self.report

    def sample(self) -> LiveHardware:
        self.samples += 1
        return live_from_report(self.report)


def cpu_only_machine() -> FakeHardware:
    report = HardwareReport(
        gpus=(),
        reason=NO_DRIVER_REASON,
        driver_version=None,
        cuda_driver_version=None,
        cpu=FAKE_CPU,
        memory=FAKE_MEMORY,
        build=CPU_BUILD,
        warnings=(),
        notes=(),
    )
    return FakeHardware(report)


def gpu_24gb_machine() -> FakeHardware:
    report = HardwareReport(
        gpus=(fake_rtx_24gb(),),
        reason=None,
        driver_version="550.54.14",
        cuda_driver_version="12.4",
        cpu=FAKE_CPU,
        memory=FAKE_MEMORY,
        build=CUDA_BUILD,
        warnings=(),
        notes=(),
    )
    return FakeHardware(report)
