"""The installed llama.cpp build (llama-cpp-python): version, GPU offload, compiled features.

The doorway (:mod:`homelab.llamacpp.backend`) loads llama-cpp-python only inside
:func:`read_build`: it is a large shared library, and a CUDA build fails to load on a machine
without the CUDA driver — which we must report, not crash on.
"""

from __future__ import annotations

from dataclasses import dataclass

from homelab.llamacpp.backend import EXPECTED_VERSION, LlamaCppUnavailable, build_facts

LLAMA_CPP_PYTHON_VERSION = EXPECTED_VERSION
CUDA_REBUILD_COMMAND = (
    'CMAKE_ARGS="-DGGML_CUDA=on -DGGML_RPC=on" .venv/bin/pip install --force-reinstall '
    f"--no-cache-dir llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
)

# a build whose AMX matrix multiply crashes (engine/amx_check.py): the Makefile's flags leave it
# out; run from the homelab checkout
AMX_REBUILD_COMMAND = (
    'CMAKE_ARGS="$(make -s cmake-args)" .venv/bin/pip install --force-reinstall --no-deps '
    f"--no-cache-dir llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
)


@dataclass(frozen=True)
class BuildInfo:
    """What the llama.cpp build can do. ``error`` says why it could not be loaded, if so."""

    version: str | None
    gpu_offload: bool | None
    system_info: str | None
    backends: tuple[str, ...]  # e.g. ("CUDA", "CPU"), parsed from system_info
    error: str | None = None
    rpc: bool | None = None  # the RPC backend (remote workers); None: not known

    @property
    def cpu_only(self) -> bool:
        return self.gpu_offload is False


def read_build() -> BuildInfo:
    """Describe the llama.cpp build; a build that does not load is described, not raised."""
    try:
        facts = build_facts()
    except LlamaCppUnavailable as error:
        return BuildInfo(None, None, None, (), error=str(error))
    return BuildInfo(
        version=facts.version,
        gpu_offload=facts.gpu_offload,
        system_info=facts.system_info,
        backends=parse_backends(facts.system_info),
        rpc=facts.rpc,
    )


def parse_backends(system_info: str) -> tuple[str, ...]:
    """Backend names in "CUDA : ARCHS = 890 | ... | CPU : SSE3 = 1 | ..." -> ("CUDA", "CPU")."""
    backends = []
    for piece in system_info.split("|"):
        name, separator, _ = piece.partition(" : ")
        if separator and name.strip():
            backends.append(name.strip())
    return tuple(backends)
