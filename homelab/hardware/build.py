"""The installed llama.cpp build (llama-cpp-python): version, GPU offload, compiled features.

``llama_cpp`` is imported lazily, inside :func:`read_build`: it loads a large shared library,
and a CUDA build fails to import on a machine without the CUDA driver — which we must report,
not crash on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
CUDA_REBUILD_COMMAND = (
    'CMAKE_ARGS="-DGGML_CUDA=on" .venv/bin/pip install --force-reinstall --no-cache-dir '
    f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
)


@dataclass(frozen=True)
class BuildInfo:
    """What the llama.cpp build can do. ``error`` says why it could not be loaded, if so."""

    version: str | None
    gpu_offload: bool | None
    system_info: str | None
    backends: tuple[str, ...]  # e.g. ("CUDA", "CPU"), parsed from system_info
    error: str | None = None

    @property
    def cpu_only(self) -> bool:
        return self.gpu_offload is False


def read_build(llama_module: Any | None = None) -> BuildInfo:
    """Describe the llama.cpp build; ``llama_module`` replaces ``llama_cpp`` in tests."""
    if llama_module is None:
        try:
            import llama_cpp
        except Exception as error:  # ImportError, or OSError/RuntimeError from the shared library
            return BuildInfo(None, None, None, (), error=_load_failure(error))
        llama_module = llama_cpp
    system_info = _text(llama_module.llama_print_system_info())
    return BuildInfo(
        version=getattr(llama_module, "__version__", None),
        gpu_offload=bool(llama_module.llama_supports_gpu_offload()),
        system_info=system_info,
        backends=parse_backends(system_info),
    )


def _load_failure(error: BaseException) -> str:
    first_line = (str(error).splitlines() or [type(error).__name__])[0]
    return (
        f"llama-cpp-python could not be loaded ({first_line}). Reinstall it: "
        f".venv/bin/pip install llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
    )


def _text(value: object) -> str:
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return text.strip()


def parse_backends(system_info: str) -> tuple[str, ...]:
    """Backend names in "CUDA : ARCHS = 890 | ... | CPU : SSE3 = 1 | ..." -> ("CUDA", "CPU")."""
    backends = []
    for piece in system_info.split("|"):
        name, separator, _ = piece.partition(" : ")
        if separator and name.strip():
            backends.append(name.strip())
    return tuple(backends)
