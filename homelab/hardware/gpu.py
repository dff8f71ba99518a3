"""NVIDIA GPUs as seen through the NVML doorway: a full description and a cheap live snapshot.

Free VRAM (not total) is what plans use: other processes (a desktop, another model) hold part
of the card, and NVML's ``free`` already accounts for them. Every optional field is ``None``
when the driver cannot answer it; renderers print "N/A".
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields
from typing import Any

import psutil

from homelab.hardware.nvml import (
    NOT_SUPPORTED,
    Nvml,
    NvmlUnavailable,
    explain_code,
    open_nvml,
    shared_nvml,
)

logger = logging.getLogger(__name__)

MILLIWATTS_PER_WATT = 1000
# Newest first: pynvml's unversioned call uses the v3 struct, which older drivers lack.
PROCESS_QUERIES = (
    (
        "compute",
        ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"),
    ),
    (
        "graphics",
        ("nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
    ),
)


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU (``used_memory_bytes`` is None where NVML hides it)."""

    pid: int
    name: str | None
    used_memory_bytes: int | None
    kind: str  # "compute", "graphics" or "compute+graphics"


@dataclass(frozen=True)
class GpuSnapshot:
    """What changes from second to second; cheap enough to read at ~1 Hz."""

    index: int
    memory_total_bytes: int
    memory_free_bytes: int
    memory_used_bytes: int
    unified_memory: bool  # True: the GPU shares host RAM (NVML reports no VRAM of its own)
    temperature_c: int | None
    power_draw_w: float | None
    power_limit_w: float | None
    utilization_gpu_percent: int | None
    utilization_memory_percent: int | None
    processes: tuple[GpuProcess, ...]


@dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA GPU: identity, capabilities and the live figures at detection time."""

    index: int
    name: str
    uuid: str | None
    compute_capability: str | None  # "8.9"
    pcie_generation: int | None  # current link (drops while idle to save power)
    pcie_width: int | None
    pcie_generation_max: int | None
    pcie_width_max: int | None
    profile_id: str | None  # matching entry of profiles/gpus.toml, if any
    memory_total_bytes: int
    memory_free_bytes: int
    memory_used_bytes: int
    unified_memory: bool
    temperature_c: int | None
    power_draw_w: float | None
    power_limit_w: float | None
    utilization_gpu_percent: int | None
    utilization_memory_percent: int | None
    processes: tuple[GpuProcess, ...]

    def snapshot(self) -> GpuSnapshot:
        """The live part of this record, as :func:`gpu_snapshot` would have returned it."""
        live = {field.name: getattr(self, field.name) for field in fields(GpuSnapshot)}
        return GpuSnapshot(**live)


def as_text(value: object) -> str | None:
    """NVML strings arrive as bytes from older nvidia-ml-py releases."""
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def device_handle(nvml: Nvml, index: int) -> Any:
    return nvml.require("nvmlDeviceGetHandleByIndex", index)


def device_count(nvml: Nvml) -> int:
    return int(nvml.require("nvmlDeviceGetCount"))


# --- live figures -------------------------------------------------------------------------


def read_snapshot(nvml: Nvml, index: int, handle: Any) -> GpuSnapshot:
    total_bytes, free_bytes, used_bytes, unified = _memory(nvml, handle)
    utilization = nvml.query("nvmlDeviceGetUtilizationRates", handle)
    temperature_sensor = nvml.constant("NVML_TEMPERATURE_GPU", 0)
    return GpuSnapshot(
        index=index,
        memory_total_bytes=total_bytes,
        memory_free_bytes=free_bytes,
        memory_used_bytes=used_bytes,
        unified_memory=unified,
        temperature_c=_int_or_none(
            nvml.query("nvmlDeviceGetTemperature", handle, temperature_sensor)
        ),
        power_draw_w=_watts(nvml.query("nvmlDeviceGetPowerUsage", handle)),
        power_limit_w=_watts(nvml.query("nvmlDeviceGetEnforcedPowerLimit", handle)),
        utilization_gpu_percent=_int_or_none(getattr(utilization, "gpu", None)),
        utilization_memory_percent=_int_or_none(getattr(utilization, "memory", None)),
        processes=read_processes(nvml, handle),
    )


def _memory(nvml: Nvml, handle: Any) -> tuple[int, int, int, bool]:
    memory, code = nvml.attempt("nvmlDeviceGetMemoryInfo", handle)
    if code == NOT_SUPPORTED:
        # Unified-memory devices (GB10, some Grace systems) report no VRAM: the GPU uses host RAM.
        host = psutil.virtual_memory()
        return int(host.total), int(host.available), int(host.total - host.available), True
    if memory is None:
        raise NvmlUnavailable(f"its memory cannot be read: {explain_code(code)}")
    return int(memory.total), int(memory.free), int(memory.used), False


def _watts(milliwatts: object) -> float | None:
    return None if milliwatts is None else int(milliwatts) / MILLIWATTS_PER_WATT  # type: ignore[call-overload]


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def read_processes(nvml: Nvml, handle: Any) -> tuple[GpuProcess, ...]:
    """Compute and graphics processes on the GPU, merged by pid, biggest first."""
    found: dict[int, tuple[int | None, list[str]]] = {}
    for kind, function_names in PROCESS_QUERIES:
        for entry in nvml.query_any(function_names, handle) or ():
            used = getattr(entry, "usedGpuMemory", None)
            previous_used, kinds = found.get(entry.pid, (None, []))
            found[entry.pid] = (_larger(previous_used, used), [*kinds, kind])
    processes = [
        GpuProcess(pid, process_name(nvml, pid), used, "+".join(kinds))
        for pid, (used, kinds) in found.items()
    ]
    return tuple(sorted(processes, key=lambda process: -(process.used_memory_bytes or 0)))


def _larger(first: int | None, second: int | None) -> int | None:
    known = [value for value in (first, second) if value is not None]
    return max(known) if known else None


def process_name(nvml: Nvml, pid: int) -> str | None:
    """NVML knows host pids even inside a container's pid namespace, so ask it first."""
    path = as_text(nvml.query("nvmlSystemGetProcessName", pid))
    if path:
        return os.path.basename(path) or path
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return None


# --- identity -----------------------------------------------------------------------------


def read_gpu(nvml: Nvml, index: int) -> GpuInfo:
    """Everything about GPU ``index``; raises NvmlUnavailable if the device cannot be opened."""
    handle = device_handle(nvml, index)
    name = as_text(nvml.query("nvmlDeviceGetName", handle)) or "unknown NVIDIA GPU"
    snapshot = read_snapshot(nvml, index, handle)
    return GpuInfo(
        name=name,
        uuid=as_text(nvml.query("nvmlDeviceGetUUID", handle)),
        compute_capability=_compute_capability(nvml, handle),
        pcie_generation=_int_or_none(nvml.query("nvmlDeviceGetCurrPcieLinkGeneration", handle)),
        pcie_width=_int_or_none(nvml.query("nvmlDeviceGetCurrPcieLinkWidth", handle)),
        pcie_generation_max=_int_or_none(nvml.query("nvmlDeviceGetMaxPcieLinkGeneration", handle)),
        pcie_width_max=_int_or_none(nvml.query("nvmlDeviceGetMaxPcieLinkWidth", handle)),
        profile_id=_profile_id(name, snapshot.memory_total_bytes),
        **_snapshot_fields(snapshot),
    )


def _compute_capability(nvml: Nvml, handle: Any) -> str | None:
    capability = nvml.query("nvmlDeviceGetCudaComputeCapability", handle)
    if capability is None:
        return None
    major, minor = capability
    return f"{major}.{minor}"


def _snapshot_fields(snapshot: GpuSnapshot) -> dict[str, Any]:
    return {field.name: getattr(snapshot, field.name) for field in fields(snapshot)}


def _profile_id(name: str, vram_bytes: int) -> str | None:
    from homelab.errors import ConfigError
    from homelab.hardware.profiles import find_gpu_profile

    try:
        return find_gpu_profile(name, vram_bytes=vram_bytes).id
    except ConfigError:
        return None


def driver_version(nvml: Nvml) -> str | None:
    return as_text(nvml.query("nvmlSystemGetDriverVersion"))


def cuda_driver_version(nvml: Nvml) -> str | None:
    """The newest CUDA version the driver supports, e.g. 12040 -> "12.4"."""
    version = nvml.query("nvmlSystemGetCudaDriverVersion")
    if version is None:
        return None
    return f"{int(version) // 1000}.{int(version) % 1000 // 10}"


# --- cheap polling ------------------------------------------------------------------------


def gpu_snapshot(nvml_module: Any | None = None) -> tuple[GpuSnapshot, ...]:
    """Live memory, temperature, power, utilisation and processes of every GPU (~1 Hz safe).

    Returns ``()`` when there is no usable NVIDIA GPU and skips a GPU that cannot be read;
    never raises for NVML problems. The default NVML session is opened once and kept.
    """
    try:
        if nvml_module is None:
            return _snapshots(shared_nvml())
        nvml = open_nvml(nvml_module)
    except NvmlUnavailable:
        return ()
    try:
        return _snapshots(nvml)
    finally:
        nvml.shutdown()


def _snapshots(nvml: Nvml) -> tuple[GpuSnapshot, ...]:
    try:
        count = device_count(nvml)
    except NvmlUnavailable:
        return ()
    snapshots = (_snapshot_or_none(nvml, index) for index in range(count))
    return tuple(snapshot for snapshot in snapshots if snapshot is not None)


def _snapshot_or_none(nvml: Nvml, index: int) -> GpuSnapshot | None:
    try:
        return read_snapshot(nvml, index, device_handle(nvml, index))
    except NvmlUnavailable:
        return None
    except Exception:  # a pynvml/driver combination we have not met must not stop the TUI
        logger.debug("GPU %d snapshot failed", index, exc_info=True)
        return None


def our_process_vram_bytes(
    gpu: int | GpuInfo | GpuSnapshot, pid: int | None = None, *, nvml_module: Any | None = None
) -> int | None:
    """VRAM held by process ``pid`` (default: this one) on ``gpu``.

    Pass a GPU index to ask NVML now, or a GpuInfo/GpuSnapshot to look in what it recorded.
    ``None`` when the process is not listed: it holds no memory there, NVML hides per-process
    figures (Windows WDDM), or we run in a container whose pids differ from the host's.
    """
    pid = os.getpid() if pid is None else pid
    if isinstance(gpu, int):
        snapshots = {snapshot.index: snapshot for snapshot in gpu_snapshot(nvml_module)}
        if gpu not in snapshots:
            return None
        gpu = snapshots[gpu]
    for process in gpu.processes:
        if process.pid == pid:
            return process.used_memory_bytes
    return None
