"""The hardware report: GPUs, CPU, RAM and the llama.cpp build, with what is wrong with them.

:func:`detect` never raises for a missing driver, a missing GPU, an old driver or a broken
llama.cpp install: it says why in ``reason`` (no GPU) or ``warnings`` (something to fix) and
reports what it can.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from homelab.hardware.build import BuildInfo, read_build
from homelab.hardware.gpu import (
    GpuInfo,
    cuda_driver_version,
    device_count,
    driver_version,
    read_gpu,
)
from homelab.hardware.host import CpuInfo, MemoryInfo, read_cpu, read_memory
from homelab.hardware.nvml import Nvml, NvmlUnavailable, open_nvml, shared_nvml
from homelab.hardware.verdict import build_verdict

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HardwareReport:
    gpus: tuple[GpuInfo, ...]
    reason: str | None  # why there is no usable GPU; None when there is one
    driver_version: str | None
    cuda_driver_version: str | None  # newest CUDA the driver supports, e.g. "12.4"
    cpu: CpuInfo
    memory: MemoryInfo
    build: BuildInfo
    warnings: tuple[str, ...]  # things the user should fix, most important first
    notes: tuple[str, ...]  # things worth knowing (GPUs skipped, fields the driver lacks)
    build_verdict: str = ""  # one line: what the llama.cpp build does here (mismatches warn)

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    def to_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document["has_gpu"] = self.has_gpu
        document["cpu"]["has_avx512"] = self.cpu.has_avx512
        return document


@dataclass(frozen=True)
class _GpuSection:
    gpus: tuple[GpuInfo, ...]
    reason: str | None
    driver_version: str | None
    cuda_driver_version: str | None
    notes: tuple[str, ...]


def detect(nvml_module: Any | None = None, *, build: BuildInfo | None = None) -> HardwareReport:
    """Describe this machine. ``nvml_module`` replaces pynvml, ``build`` the llama.cpp probe."""
    section = _detect_gpus(nvml_module)
    build = read_build() if build is None else build
    verdict = build_verdict(section.gpus, build, section.cuda_driver_version)
    return HardwareReport(
        gpus=section.gpus,
        reason=section.reason,
        driver_version=section.driver_version,
        cuda_driver_version=section.cuda_driver_version,
        cpu=read_cpu(),
        memory=read_memory(),
        build=build,
        warnings=verdict.warnings,
        notes=section.notes,
        build_verdict=verdict.summary,
    )


def _detect_gpus(nvml_module: Any | None) -> _GpuSection:
    try:
        nvml = shared_nvml() if nvml_module is None else open_nvml(nvml_module)
    except NvmlUnavailable as unavailable:
        return _no_gpu(f"no NVIDIA GPU: {unavailable.reason}. Running CPU-only.")
    try:
        return _read_gpu_section(nvml)
    except Exception as error:  # a pynvml/driver combination we have not met: report, go on
        logger.debug("reading the GPUs failed", exc_info=True)
        return _no_gpu(
            f"no usable NVIDIA GPU: NVML failed unexpectedly ({error!r}). Running CPU-only."
        )
    finally:
        if nvml_module is not None:
            nvml.shutdown()


def _no_gpu(reason: str, *, driver: str | None = None, cuda: str | None = None) -> _GpuSection:
    return _GpuSection((), reason, driver, cuda, ())


def _read_gpu_section(nvml: Nvml) -> _GpuSection:
    driver, cuda = driver_version(nvml), cuda_driver_version(nvml)
    try:
        count = device_count(nvml)
    except NvmlUnavailable as unavailable:
        return _no_gpu(f"no NVIDIA GPU: {unavailable.reason}. Running CPU-only.", driver=driver)
    gpus, notes = [], []
    for index in range(count):
        try:
            gpus.append(read_gpu(nvml, index))
        except NvmlUnavailable as unavailable:
            notes.append(f"GPU {index} skipped: {unavailable.reason}")
    notes.extend(_missing_function_notes(nvml))
    reason = None if gpus else _no_usable_gpu_reason(count)
    return _GpuSection(tuple(gpus), reason, driver, cuda, tuple(notes))


def _no_usable_gpu_reason(count: int) -> str:
    if count == 0:
        return (
            "no NVIDIA GPU: the NVIDIA driver is loaded but lists no GPU "
            "(check CUDA_VISIBLE_DEVICES / the container's --gpus option). Running CPU-only."
        )
    return f"no usable NVIDIA GPU: none of the {count} GPUs could be read. Running CPU-only."


def _missing_function_notes(nvml: Nvml) -> list[str]:
    missing = nvml.missing_functions
    if not missing:
        return []
    return [
        f"the NVIDIA driver lacks {', '.join(missing)}; those fields show N/A "
        "(a newer driver provides them)"
    ]
