"""What the installed llama.cpp build can do, and ggml's device registry.

``hardware`` describes the build from :func:`build_facts`; the model loader asks
:func:`cpu_buffer_type` where to keep MoE experts that stay in host memory. The device list
comes from ggml's registry (the same one llama.cpp splits layers over), opened through ggml's
own libraries because llama-cpp-python binds only llama.h.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from homelab.errors import EngineError
from homelab.llamacpp._lib import EXPECTED_VERSION, LlamaCppUnavailable, ggml_library, lib

__all__ = [
    "EXPECTED_VERSION",
    "BuildFacts",
    "Device",
    "LlamaCppUnavailable",
    "build_facts",
    "cpu_buffer_type",
    "devices",
    "supports_gpu_offload",
]

# enum ggml_backend_dev_type
DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
_CPU_DEVICE = 0


@dataclass(frozen=True)
class BuildFacts:
    """The llama-cpp-python build: its version, whether it can offload, ggml's feature list."""

    version: str | None
    gpu_offload: bool
    system_info: str  # e.g. "CUDA : ARCHS = 890 | ... | CPU : SSE3 = 1 | ..."
    rpc: bool = False  # built with the RPC backend (remote workers, ``homelab worker``)


@dataclass(frozen=True)
class Device:
    """One device in ggml's registry, with the memory it reports now."""

    name: str  # e.g. "CPU", "CUDA0"
    description: str
    kind: str  # "cpu", "gpu", "igpu" or "accel"
    free_bytes: int
    total_bytes: int


def build_facts() -> BuildFacts:
    """The build's facts; raises LlamaCppUnavailable when llama-cpp-python does not load."""
    module = lib()
    info = module.llama_print_system_info()
    text = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    return BuildFacts(
        version=getattr(module, "__version__", None),
        gpu_offload=supports_gpu_offload(),
        system_info=text.strip(),
        rpc=_has_rpc(),
    )


def _has_rpc() -> bool:
    from homelab.llamacpp.rpc import available

    return available()


def supports_gpu_offload() -> bool:
    """Whether this build has a local GPU backend (a CPU-only wheel says False).

    llama.cpp's own ``llama_supports_gpu_offload`` also says True for a CPU build with the RPC
    backend (remote devices count as GPUs), so the answer comes from the device registry.
    """
    if not lib().llama_supports_gpu_offload():
        return False
    return any(d.kind in ("gpu", "igpu") and not d.name.startswith("RPC") for d in devices())


def devices() -> tuple[Device, ...]:
    """Every device in ggml's registry, in the registry's order."""
    ggml, base = _registry()
    found = []
    for index in range(ggml.ggml_backend_dev_count()):
        device = ggml.ggml_backend_dev_get(index)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        base.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        found.append(
            Device(
                name=_text(base.ggml_backend_dev_name(device)),
                description=_text(base.ggml_backend_dev_description(device)),
                kind=DEVICE_KINDS.get(base.ggml_backend_dev_type(device), "unknown"),
                free_bytes=int(free.value),
                total_bytes=int(total.value),
            )
        )
    return tuple(found)


def cpu_buffer_type() -> int:
    """The CPU device's buffer type (host memory), for tensor buffer-type overrides."""
    ggml, base = _registry()
    device = ggml.ggml_backend_dev_by_type(_CPU_DEVICE)
    if not device:
        raise EngineError(
            "llama.cpp has no CPU device registered (broken installation)",
            hint="Reinstall llama-cpp-python.",
        )
    return int(base.ggml_backend_dev_buffer_type(device))


def _registry() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """libggml (the registry) and libggml-base (device queries), with their C signatures."""
    ggml, base = ggml_library("ggml"), ggml_library("ggml-base")
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    for name in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(base, name).restype = ctypes.c_char_p
        getattr(base, name).argtypes = [ctypes.c_void_p]
    base.ggml_backend_dev_type.restype = ctypes.c_int
    base.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    base.ggml_backend_dev_memory.restype = None
    base.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p] + [
        ctypes.POINTER(ctypes.c_size_t)
    ] * 2
    base.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    base.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    return ggml, base


def _text(value: bytes | None) -> str:
    return (value or b"").decode(errors="replace")
