"""The CUDA libraries a llama.cpp build was compiled against, found without ``LD_LIBRARY_PATH``.

``make`` records how it built llama-cpp-python in ``<venv>/homelab-build.json``
(``tools/build_route.py``): the route (cpu, nvcc, pip, cpu-fallback, user), why, and for the
pip route the folder of NVIDIA's CUDA wheels (``<venv>/cuda/nvidia/cu13/lib``). A library built
there needs ``libcudart.so.13`` and ``libcublas*.so.13``, which no system search path holds:
:func:`preload` opens them by full path before ``import llama_cpp`` (the doorway, :mod:`._lib`),
so when libggml-cuda asks for those sonames the loader finds them already loaded.

:func:`runtime_version` asks the CUDA runtime that is loaded (never loads one) for its version.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

RECORD_NAME = "homelab-build.json"
RECORD_ENV = "HOMELAB_BUILD_RECORD"  # another record's path (tests; a venv built elsewhere)
# the order the loader needs: cuBLAS needs cuBLASLt, both need nothing of cudart's
PRELOAD_NAMES = ("libcudart.so", "libcublasLt.so", "libcublas.so")
CUDART_SONAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11")


@dataclass(frozen=True)
class BuildRecord:
    """How ``make`` built llama-cpp-python (what ``tools/build_route.py`` wrote)."""

    route: str  # cpu, nvcc, pip, cpu-fallback, user
    reason: str
    cuda_version: str | None = None  # of the toolkit it was compiled with, e.g. "13.5"
    architectures: tuple[int, ...] = ()  # e.g. (89,) for sm_89
    cuda_lib_dir: str | None = None  # the pip route's CUDA libraries
    vmm: bool | None = None  # ggml's virtual-memory pool compiled in
    fix: str | None = None  # cpu-fallback: how to get the CUDA build


def record_path() -> Path:
    return Path(os.environ.get(RECORD_ENV) or Path(sys.prefix) / RECORD_NAME)


def read_record(path: Path | None = None) -> BuildRecord | None:
    """The build record, or None when there is none or it is unreadable (a venv built by hand)."""
    try:
        document = json.loads((path or record_path()).read_text(encoding="utf-8"))
        return BuildRecord(
            route=str(document["name"]),
            reason=str(document.get("reason") or ""),
            cuda_version=document.get("cuda_version"),
            architectures=tuple(int(arch) for arch in document.get("architectures") or ()),
            cuda_lib_dir=document.get("cuda_lib_dir"),
            vmm=document.get("vmm"),
            fix=document.get("fix"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def preload(record: BuildRecord | None) -> tuple[Path, ...]:
    """Open the recorded CUDA libraries (pip route) globally; returns those opened.

    A library that is missing or fails to open is skipped: the import that follows then fails
    with the loader's own message, which the doorway turns into an error with the fix.
    """
    if record is None or not record.cuda_lib_dir:
        return ()
    folder = Path(record.cuda_lib_dir)
    opened = []
    for name in PRELOAD_NAMES:
        candidates = sorted(folder.glob(name + ".[0-9]*"), key=lambda path: len(path.name))
        if not candidates:
            continue
        try:
            ctypes.CDLL(str(candidates[0]), mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        opened.append(candidates[0])
    return tuple(opened)


def runtime_version() -> str | None:
    """The version of the CUDA runtime loaded in this process ("13.5"), None when none is.

    Only asks a libcudart that is already loaded (``RTLD_NOLOAD``): after llama.cpp's CUDA
    backend loaded, that is the one it uses.
    """
    for soname in CUDART_SONAMES:
        try:
            cudart = ctypes.CDLL(soname, mode=os.RTLD_NOLOAD)
        except OSError:
            continue
        version = ctypes.c_int(0)
        if cudart.cudaRuntimeGetVersion(ctypes.byref(version)) != 0:
            return None
        return f"{version.value // 1000}.{version.value % 1000 // 10}"
    return None
