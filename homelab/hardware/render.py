"""Plain-text rendering of a :class:`HardwareReport` and the GPU profiles for ``homelab hw``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from homelab.hardware.build import BuildInfo
from homelab.hardware.gpu import GpuInfo, GpuProcess
from homelab.hardware.host import CpuInfo, MemoryInfo
from homelab.hardware.report import HardwareReport
from homelab.units import GIB, format_gib

if TYPE_CHECKING:
    from homelab.hardware.profiles import GpuProfile

NOT_AVAILABLE = "N/A"
LABEL_WIDTH = 16
THIS_PROCESS = "  <- this process"


def shown(value: object, unit: str = "") -> str:
    return NOT_AVAILABLE if value is None else f"{value}{unit}"


def row(label: str, text: str, indent: int = 0) -> str:
    return f"{' ' * indent}{label:<{LABEL_WIDTH - indent}}{text}"


def format_report(report: HardwareReport) -> str:
    lines: list[str] = []
    if report.gpus:
        for gpu in report.gpus:
            lines.extend(gpu_lines(gpu))
        driver = f"{shown(report.driver_version)} (CUDA {shown(report.cuda_driver_version)})"
        lines.append(row("NVIDIA driver", driver))
    else:
        lines.append(row("GPU", f"none — {report.reason}"))
    lines.append(row("CPU", cpu_text(report.cpu)))
    lines.append(row("RAM", memory_text(report.memory)))
    lines.extend(build_lines(report.build))
    if report.build_verdict:
        lines.append(row("verdict", report.build_verdict))
    if report.notes or report.warnings:
        lines.append("")
    lines.extend(f"note: {note}" for note in report.notes)
    lines.extend(f"WARNING: {warning}" for warning in report.warnings)
    return "\n".join(lines)


def gpu_lines(gpu: GpuInfo) -> list[str]:
    profile = f"  (profile {gpu.profile_id})" if gpu.profile_id else ""
    memory = (
        f"{format_gib(gpu.memory_free_bytes)} free of {format_gib(gpu.memory_total_bytes)}"
        f" ({format_gib(gpu.memory_used_bytes)} used)"
        + (" — unified with host RAM" if gpu.unified_memory else "")
    )
    return [
        row(f"GPU {gpu.index}", f"{gpu.name}{profile}"),
        row("uuid", shown(gpu.uuid), indent=2),
        row("VRAM", memory, indent=2),
        row("compute cap.", shown(gpu.compute_capability), indent=2),
        row("PCIe", pcie_text(gpu), indent=2),
        row("sensors", sensors_text(gpu), indent=2),
        *process_lines(gpu.processes),
    ]


def pcie_text(gpu: GpuInfo) -> str:
    now = f"gen {shown(gpu.pcie_generation)} x{shown(gpu.pcie_width)}"
    most = f"gen {shown(gpu.pcie_generation_max)} x{shown(gpu.pcie_width_max)}"
    return f"{now} now, {most} max"


def sensors_text(gpu: GpuInfo) -> str:
    power = f"{_watts(gpu.power_draw_w)} of {_watts(gpu.power_limit_w)}"
    return (
        f"{shown(gpu.temperature_c, ' °C')} · {power} · "
        f"GPU {shown(gpu.utilization_gpu_percent, ' %')} · "
        f"memory bus {shown(gpu.utilization_memory_percent, ' %')}"
    )


def _watts(value: float | None) -> str:
    return NOT_AVAILABLE if value is None else f"{value:.1f} W"


def process_lines(processes: tuple[GpuProcess, ...]) -> list[str]:
    if not processes:
        return [row("processes", "none", indent=2)]
    texts = [process_text(process) for process in processes]
    return [row("processes" if i == 0 else "", text, indent=2) for i, text in enumerate(texts)]


def process_text(process: GpuProcess) -> str:
    ours = THIS_PROCESS if process.pid == os.getpid() else ""
    return (
        f"{process.pid:>7}  {format_gib(process.used_memory_bytes):>10}  "
        f"{shown(process.name)} ({process.kind}){ours}"
    )


def cpu_text(cpu: CpuInfo) -> str:
    cores = (
        f"{shown(cpu.physical_cores)} cores / {shown(cpu.logical_cores)} threads"
        f" ({shown(cpu.usable_cores)} usable)"
    )
    avx2 = NOT_AVAILABLE if cpu.has_avx2 is None else ("yes" if cpu.has_avx2 else "no")
    avx512 = f"yes ({len(cpu.avx512_flags)} flags)" if cpu.has_avx512 else "no"
    return f"{cpu.model} · {cpu.architecture} · {cores} · AVX2 {avx2} · AVX-512 {avx512}"


def memory_text(memory: MemoryInfo) -> str:
    available, total = format_gib(memory.ram_available_bytes), format_gib(memory.ram_total_bytes)
    text = (
        f"{available} available of {total}"
        f" · swap {format_gib(memory.swap_total_bytes)} ({format_gib(memory.swap_used_bytes)} used)"
    )
    if memory.cgroup_limit_bytes is not None:
        text += f" · container limit {format_gib(memory.cgroup_limit_bytes)}"
    return text


def build_lines(build: BuildInfo) -> list[str]:
    if build.error is not None:
        return [row("llama.cpp", "not loadable (see the warning below)")]
    offload = {True: "yes", False: "no (CPU-only build)", None: NOT_AVAILABLE}[build.gpu_offload]
    backends = ", ".join(build.backends) or NOT_AVAILABLE
    summary = f"{shown(build.version)} · GPU offload: {offload} · backends: {backends}"
    if build.rpc is not None:
        summary += " · RPC workers: " + ("yes" if build.rpc else "no (built without GGML_RPC)")
    lines = [row("llama.cpp", summary), row("", shown(build.system_info))]
    if build.cuda:
        lines.append(row("CUDA build", cuda_text(build)))
    if build.record is not None:
        lines.append(row("built by", f"make, route {build.record.route}: {build.record.reason}"))
    return lines


def cuda_text(build: BuildInfo) -> str:
    """ "13.5 · sm_89 · VMM pool: no (GGML_CUDA_NO_VMM)" """
    archs = ", ".join(f"sm_{arch}" for arch in build.cuda_architectures) or NOT_AVAILABLE
    vmm = {True: "yes", False: "no (GGML_CUDA_NO_VMM)", None: NOT_AVAILABLE}[build.vmm]
    return f"CUDA {shown(build.cuda_version)} · {archs} · VMM pool: {vmm}"


def format_profiles(profiles: Mapping[str, GpuProfile]) -> str:
    """One line per GPU profile the planner knows (``homelab hw --profiles``)."""
    return "\n".join(
        f"{p.id:<18} {p.name:<26} {p.vram_bytes / GIB:>6.0f} GiB "
        f"{p.bandwidth_gb_s:>7.0f} GB/s  cc {p.compute_capability:<5}{p.fp16_tflops:>7.1f} TFLOPS"
        for p in profiles.values()
    )
