"""ggml's device registry: the devices llama.cpp splits layers over, with their memory now.

Opened through ggml's own libraries because llama-cpp-python binds only llama.h. The model
loader asks :func:`cpu_buffer_type` where to keep MoE experts that stay in host memory; the
RPC backend (:mod:`.rpc`) reads the registry to name a load's devices.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from homelab.errors import EngineError
from homelab.llamacpp._lib import ggml_library

# enum ggml_backend_dev_type
DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
_CPU_DEVICE = 0


@dataclass(frozen=True)
class Device:
    """One device in ggml's registry, with the memory it reports now."""

    name: str  # e.g. "CPU", "CUDA0"
    description: str
    kind: str  # "cpu", "gpu", "igpu" or "accel"
    free_bytes: int
    total_bytes: int


def devices() -> tuple[Device, ...]:
    """Every device in ggml's registry, in the registry's order."""
    ggml, base = open_registry()
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
    ggml, base = open_registry()
    device = ggml.ggml_backend_dev_by_type(_CPU_DEVICE)
    if not device:
        raise EngineError(
            "llama.cpp has no CPU device registered (broken installation)",
            hint="Reinstall llama-cpp-python.",
        )
    return int(base.ggml_backend_dev_buffer_type(device))


def open_registry() -> tuple[ctypes.CDLL, ctypes.CDLL]:
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
