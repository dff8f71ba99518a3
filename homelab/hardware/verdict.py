"""Whether the llama.cpp build can use the GPUs here: one line, and a warning with the fix for
each mismatch, before any load fails.

The mismatches: a CPU-only build on a machine with an NVIDIA GPU; a CUDA build newer than the
driver runs (CUDA's minor-version compatibility: a driver runs every release of its own CUDA
major version, none of a newer one); a GPU whose architecture the build was not compiled for
(older than all of them: it cannot run; newer: only through JIT compilation of the PTX, slow at
every first load and needing a driver as new as the build's CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass

from homelab.hardware.build import CUDA_REBUILD_COMMAND, BuildInfo
from homelab.hardware.gpu import GpuInfo

# the oldest driver branch that runs each CUDA major release
MIN_DRIVER = {13: 580, 12: 525, 11: 450}
REBUILD = f"rebuild it in the homelab checkout: `{CUDA_REBUILD_COMMAND}`"


@dataclass(frozen=True)
class Verdict:
    summary: str  # one line: what the build does on this machine
    warnings: tuple[str, ...]  # each mismatch, with its fix


def build_verdict(
    gpus: tuple[GpuInfo, ...], build: BuildInfo, cuda_driver_version: str | None
) -> Verdict:
    """The build against the GPUs and the driver (``cuda_driver_version``: NVML's, "13.0")."""
    if build.error is not None:
        return Verdict("llama.cpp does not load", (build.error,))
    if not build.cuda:
        return _cpu_build(gpus, build)
    what = _cuda_text(build)
    if not gpus:
        return Verdict(f"{what}; no NVIDIA GPU here, so it runs on the CPU", ())
    warnings = [*_driver_warnings(build, cuda_driver_version), *_arch_warnings(gpus, build)]
    if warnings:
        return Verdict(f"{what}: does not match this machine (see the warnings)", tuple(warnings))
    driver = f"driver CUDA {cuda_driver_version}" if cuda_driver_version else "the driver"
    return Verdict(f"{what}: runs on every GPU here with {driver}", ())


def _cpu_build(gpus: tuple[GpuInfo, ...], build: BuildInfo) -> Verdict:
    if not gpus:
        return Verdict("CPU build; no NVIDIA GPU here", ())
    if not build.cpu_only:  # another GPU backend (Vulkan, ...): not ours to judge
        return Verdict(f"{', '.join(build.backends)} build", ())
    record = build.record
    why = ""
    if record is not None and record.route == "cpu-fallback":
        why = f" `make` built it for the CPU because {record.reason}; to fix: {record.fix}."
    warning = (
        f"llama.cpp was built for CPU only, but {gpus[0].name} is present: nothing will run "
        f"on the GPU.{why} Rebuild it with CUDA:\n  {CUDA_REBUILD_COMMAND}"
    )
    return Verdict("CPU-only build on a machine with an NVIDIA GPU", (warning,))


def _cuda_text(build: BuildInfo) -> str:
    version = f"CUDA {build.cuda_version}" if build.cuda_version else "CUDA (version unknown)"
    archs = ", ".join(f"sm_{arch}" for arch in build.cuda_architectures) or "unknown"
    return f"{version} build for {archs}"


def _major(version: str) -> int | None:
    head = version.split(".")[0]
    return int(head) if head.isdigit() else None


def _driver_warnings(build: BuildInfo, cuda_driver_version: str | None) -> list[str]:
    if build.cuda_version is None or cuda_driver_version is None:
        return []
    built, runs = _major(build.cuda_version), _major(cuda_driver_version)
    if built is None or runs is None or runs >= built:
        return []
    need = MIN_DRIVER.get(built)
    update = f"update the NVIDIA driver to {need} or newer" if need else "update the driver"
    return [
        f"the NVIDIA driver supports CUDA {cuda_driver_version}, older than this build's CUDA "
        f"{build.cuda_version}: llama.cpp will fail to start on the GPU. Either {update}, or "
        f"install a CUDA toolkit this driver runs and {REBUILD}"
    ]


def _arch_warnings(gpus: tuple[GpuInfo, ...], build: BuildInfo) -> list[str]:
    archs = build.cuda_architectures
    if not archs:
        return []
    built = ", ".join(f"sm_{arch}" for arch in archs)
    warnings = []
    for gpu in gpus:
        arch = _arch(gpu.compute_capability)
        if arch is None or arch in archs:
            continue
        where = f"GPU {gpu.index} ({gpu.name}, sm_{arch})"
        if arch < min(archs):
            warnings.append(
                f"{where} is older than every architecture this build has ({built}): llama.cpp "
                f"cannot run on it. To compile for every GPU here, {REBUILD}"
            )
        else:
            warnings.append(
                f"{where} is not among this build's architectures ({built}): it runs only "
                f"through JIT compilation of the PTX, slowly at every first load. To compile "
                f"for every GPU here, {REBUILD}"
            )
    return warnings


def _arch(compute_capability: str | None) -> int | None:
    if not compute_capability:
        return None
    major, _, minor = compute_capability.partition(".")
    return int(major) * 10 + int(minor or 0) if major.isdigit() and minor.isdigit() else None
