"""What the installed llama.cpp build can do.

``hardware`` describes the build from :func:`build_facts`: its version, ggml's feature list,
whether it offloads to a local GPU (asked of the device registry, :mod:`.devices`) and whether
it has the RPC backend (:mod:`.rpc`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from homelab.llamacpp import cuda
from homelab.llamacpp._lib import EXPECTED_VERSION, LlamaCppUnavailable, lib
from homelab.llamacpp.devices import devices
from homelab.llamacpp.rpc import available as has_rpc

BuildRecord = cuda.BuildRecord

__all__ = [
    "EXPECTED_VERSION",
    "BuildFacts",
    "BuildRecord",
    "LlamaCppUnavailable",
    "build_facts",
    "supports_gpu_offload",
]


@dataclass(frozen=True)
class BuildFacts:
    """The llama-cpp-python build: its version, whether it can offload, ggml's feature list."""

    version: str | None
    gpu_offload: bool
    system_info: str  # e.g. "CUDA : ARCHS = 890 | ... | CPU : SSE3 = 1 | ..."
    rpc: bool = False  # built with the RPC backend (remote workers, ``homelab worker``)
    cuda_version: str | None = None  # the CUDA runtime it loaded (or was recorded with)
    record: BuildRecord | None = None  # how ``make`` built it (tools/build_route.py)


def build_facts() -> BuildFacts:
    """The build's facts; raises LlamaCppUnavailable when llama-cpp-python does not load."""
    module = lib()
    record = cuda.read_record()
    info = module.llama_print_system_info()
    text = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    return BuildFacts(
        version=getattr(module, "__version__", None),
        gpu_offload=supports_gpu_offload(),
        system_info=text.strip(),
        rpc=has_rpc(),
        cuda_version=_cuda_version(text, record),
        record=record,
    )


def _cuda_version(system_info: str, record: BuildRecord | None) -> str | None:
    """A CUDA build's CUDA version: the loaded runtime's, else the recorded toolkit's."""
    if "CUDA :" not in system_info:
        return None
    return cuda.runtime_version() or (record.cuda_version if record else None)


def cpu_library_stamp() -> str:
    """Which build of ggml's CPU backend is installed: its path, size and modification time
    (a rebuilt llama-cpp-python has another), for verdicts kept per build."""
    library = Path(str(lib().__file__)).parent / "lib" / "libggml-cpu.so"
    stat = library.stat() if library.exists() else None
    return f"{library}|{stat.st_size}|{stat.st_mtime_ns}" if stat else f"{library}|missing"


def supports_gpu_offload() -> bool:
    """Whether this build has a local GPU backend (a CPU-only wheel says False).

    llama.cpp's own ``llama_supports_gpu_offload`` also says True for a CPU build with the RPC
    backend (remote devices count as GPUs), so the answer comes from the device registry.
    """
    if not lib().llama_supports_gpu_offload():
        return False
    return any(d.kind in ("gpu", "igpu") and not d.name.startswith("RPC") for d in devices())
