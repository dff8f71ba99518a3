"""The one ``import llama_cpp``: lazy, with homelab's log callback and backend init installed.

Importing llama-cpp-python loads a large shared library (and a CUDA build fails to load on a
machine without the driver), so nothing imports it at module level: :func:`lib` does, on the
first call that needs llama.cpp, and turns a failure into an :class:`EngineError` that says
how to reinstall. The import statement runs on every call (a dictionary lookup once loaded),
so a test that hides ``llama_cpp`` from ``sys.modules`` sees the failure path.

Before the first import, the CUDA libraries ``make`` built against are opened from where it
recorded them (:mod:`.cuda`: NVIDIA's pip wheels are on no search path), so a CUDA build loads
without ``LD_LIBRARY_PATH``.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Self

from homelab.errors import EngineError
from homelab.llamacpp import cuda
from homelab.llamacpp.log import on_log

EXPECTED_VERSION = "0.3.36"  # the llama-cpp-python release homelab is written against
REINSTALL_COMMAND = f".venv/bin/pip install llama-cpp-python=={EXPECTED_VERSION}"

_install_lock = threading.Lock()
_callback: Any = None  # kept alive for as long as llama.cpp may call it
_ggml: dict[str, ctypes.CDLL] = {}
_preloaded: list[bool] = []  # the recorded CUDA libraries were opened (once per process)


class LlamaCppUnavailable(EngineError):
    """llama-cpp-python is missing or its shared library does not load."""

    title = "llama.cpp is not available"

    def __init__(self, cause: BaseException) -> None:
        self.first_line = (str(cause).splitlines() or [type(cause).__name__])[0]
        super().__init__(
            f"llama-cpp-python could not be loaded ({self.first_line})",
            hint=_hint(self.first_line),
        )


def _hint(first_line: str) -> str:
    """What to do, by what failed to load: the driver's library, CUDA's own, or the package."""
    if "libcuda.so" in first_line:
        return (
            "This llama.cpp was built with CUDA and the NVIDIA driver's libcuda is missing: "
            "install or repair the NVIDIA driver (`nvidia-smi` must work), or rebuild it for "
            "this machine in the homelab checkout: make rebuild-llama"
        )
    if any(name in first_line for name in ("libcudart", "libcublas")):
        return (
            "The CUDA libraries this llama.cpp was built against are gone (a removed toolkit, "
            "or .venv/cuda): rebuild it in the homelab checkout: make rebuild-llama"
        )
    return f"Reinstall it: {REINSTALL_COMMAND}"


def lib() -> ModuleType:
    """llama-cpp-python's module (slow the first time), with homelab's log handling on."""
    global _callback
    if not _preloaded:
        cuda.preload(cuda.read_record())
        _preloaded.append(True)
    try:
        import llama_cpp
    except Exception as error:  # ImportError, or OSError/RuntimeError from the shared library
        raise LlamaCppUnavailable(error) from error
    if _callback is None:
        with _install_lock:
            if _callback is None:
                callback = llama_cpp.llama_log_callback(on_log)
                llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
                llama_cpp.llama_backend_init()
                _callback = callback
    return llama_cpp


def library_handle() -> ctypes.CDLL:
    """libllama as llama-cpp-python opened it (to bind a function another way than it does)."""
    handle: ctypes.CDLL = lib().llama_cpp._lib
    return handle


def ggml_library(name: str) -> ctypes.CDLL:
    """One of the ggml libraries shipped beside libllama (``ggml``, ``ggml-base``), opened once.

    llama-cpp-python binds only llama.h; the device registry lives in ggml's own libraries.
    The wheel ships ``libggml.so``, ``libggml.so.0``… as copies, not symlinks, and libllama
    links the sonames (``libggml.so.0``): opening another copy would load a second ggml with
    its own device registry and abort callback, so the soname is opened when it is there.
    """
    if name not in _ggml:
        folder = Path(str(lib().__file__)).parent / "lib"
        soname = folder / f"lib{name}.so.0"
        path = soname if soname.exists() else folder / f"lib{name}.so"
        _ggml[name] = ctypes.CDLL(str(path))
    return _ggml[name]


def to_bytes(text: str | Path) -> bytes:
    """A path or string as llama.cpp's C API takes it."""
    return str(text).encode("utf-8")


class Closing:
    """``with`` support for anything that frees itself in ``close()`` (models, contexts, engines):
    leaving the block closes it, whatever happened inside."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
