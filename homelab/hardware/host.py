"""The host: CPU model, cores and SIMD flags; RAM and swap (psutil)."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

import psutil

CPUINFO_PATH = Path("/proc/cpuinfo")
# cgroup v2, then v1: a container's memory limit, which psutil does not see.
CGROUP_MEMORY_LIMIT_PATHS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


@dataclass(frozen=True)
class CpuInfo:
    model: str
    architecture: str
    physical_cores: int | None
    logical_cores: int | None
    usable_cores: int | None  # cores this process may run on (affinity / container cpuset)
    has_avx2: bool | None  # None: /proc/cpuinfo not readable, or not an x86 CPU
    avx512_flags: tuple[str, ...]  # e.g. ("avx512f", "avx512bw", ...); empty without AVX-512
    has_amx: bool = False  # AMX tiles (Intel Sapphire Rapids and later): see engine/amx_check

    @property
    def has_avx512(self) -> bool:
        return "avx512f" in self.avx512_flags


@dataclass(frozen=True)
class MemoryInfo:
    ram_total_bytes: int
    ram_available_bytes: int
    swap_total_bytes: int
    swap_used_bytes: int
    cgroup_limit_bytes: int | None  # a container limit below the host's RAM, if any


def read_cpu(cpuinfo_text: str | None = None) -> CpuInfo:
    """Describe the CPU; ``cpuinfo_text`` overrides /proc/cpuinfo (for tests)."""
    text = _read_text(CPUINFO_PATH) if cpuinfo_text is None else cpuinfo_text
    fields = _first_processor_fields(text or "")
    flags = fields.get("flags", "").split()
    return CpuInfo(
        model=_cpu_model(fields),
        architecture=platform.machine() or "unknown",
        physical_cores=psutil.cpu_count(logical=False),
        logical_cores=psutil.cpu_count(logical=True),
        usable_cores=_usable_cores(),
        has_avx2=("avx2" in flags) if flags else None,
        avx512_flags=tuple(flag for flag in flags if flag.startswith("avx512")),
        has_amx="amx_tile" in flags,
    )


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _first_processor_fields(cpuinfo_text: str) -> dict[str, str]:
    """Key/value pairs of the first processor block (all cores share model and flags)."""
    result: dict[str, str] = {}
    for line in cpuinfo_text.splitlines():
        if not line.strip():
            if result:
                break
            continue
        key, _, value = line.partition(":")
        result.setdefault(key.strip().lower(), value.strip())
    return result


def _cpu_model(fields: dict[str, str]) -> str:
    for key in ("model name", "hardware", "cpu model", "processor"):
        value = fields.get(key, "")
        if value and not value.isdigit():
            return value
    return platform.processor() or platform.machine() or "unknown CPU"


def _usable_cores() -> int | None:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def read_memory() -> MemoryInfo:
    ram = psutil.virtual_memory()
    swap = psutil.swap_memory()
    return MemoryInfo(
        ram_total_bytes=int(ram.total),
        ram_available_bytes=int(ram.available),
        swap_total_bytes=int(swap.total),
        swap_used_bytes=int(swap.used),
        cgroup_limit_bytes=_cgroup_limit_bytes(int(ram.total)),
    )


def _cgroup_limit_bytes(ram_total_bytes: int) -> int | None:
    for path in CGROUP_MEMORY_LIMIT_PATHS:
        text = (_read_text(path) or "").strip()
        if text.isdigit():
            limit = int(text)
            return limit if limit < ram_total_bytes else None
    return None
