"""Where the dashboard gets hardware facts from (Textual-free).

The app asks a :class:`HardwareSource` for the full report once (and on demand) and for a
cheap :class:`LiveHardware` sample about once a second. :class:`LocalHardware` reads this
machine through ``homelab.hardware``; tests hand in a fixed source so snapshots are identical
on every machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from homelab.hardware.gpu import GpuSnapshot
from homelab.hardware.report import HardwareReport


@dataclass(frozen=True)
class LiveHardware:
    """What the hardware panel refreshes at ~1 Hz."""

    gpus: tuple[GpuSnapshot, ...]
    cpu_percent: float | None
    ram_total_bytes: int
    ram_available_bytes: int


@dataclass(frozen=True)
class VramShare:
    """One GPU's memory split three ways, in bytes."""

    ours_bytes: int
    other_bytes: int
    free_bytes: int
    ours_known: bool  # False: NVML does not list our process (container pid namespace, WDDM)


class HardwareSource(Protocol):
    def detect(self) -> HardwareReport: ...

    def sample(self) -> LiveHardware: ...


class LocalHardware:
    """This machine, through NVML and psutil."""

    def detect(self) -> HardwareReport:
        from homelab.hardware.report import detect

        return detect()

    def sample(self) -> LiveHardware:
        import psutil

        from homelab.hardware.gpu import gpu_snapshot

        memory = psutil.virtual_memory()
        return LiveHardware(
            gpus=gpu_snapshot(),
            cpu_percent=psutil.cpu_percent(interval=None),
            ram_total_bytes=int(memory.total),
            ram_available_bytes=int(memory.available),
        )


def live_from_report(report: HardwareReport) -> LiveHardware:
    """A first sample taken from the detection report (before the first 1 Hz refresh)."""
    snapshots = tuple(
        GpuSnapshot(
            index=gpu.index,
            memory_total_bytes=gpu.memory_total_bytes,
            memory_free_bytes=gpu.memory_free_bytes,
            memory_used_bytes=gpu.memory_used_bytes,
            unified_memory=gpu.unified_memory,
            temperature_c=gpu.temperature_c,
            power_draw_w=gpu.power_draw_w,
            power_limit_w=gpu.power_limit_w,
            utilization_gpu_percent=gpu.utilization_gpu_percent,
            utilization_memory_percent=gpu.utilization_memory_percent,
            processes=gpu.processes,
        )
        for gpu in report.gpus
    )
    return LiveHardware(
        gpus=snapshots,
        cpu_percent=None,
        ram_total_bytes=report.memory.ram_total_bytes,
        ram_available_bytes=report.memory.ram_available_bytes,
    )


def vram_share(snapshot: GpuSnapshot, pid: int | None = None) -> VramShare:
    """Split used VRAM into this process's part and everyone else's."""
    pid = os.getpid() if pid is None else pid
    ours = [p.used_memory_bytes for p in snapshot.processes if p.pid == pid]
    ours_bytes = sum(value or 0 for value in ours)
    used_bytes = max(snapshot.memory_total_bytes - snapshot.memory_free_bytes, 0)
    return VramShare(
        ours_bytes=min(ours_bytes, used_bytes),
        other_bytes=max(used_bytes - ours_bytes, 0),
        free_bytes=snapshot.memory_free_bytes,
        ours_known=bool(ours),
    )
