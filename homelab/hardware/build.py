"""The installed llama.cpp build (llama-cpp-python): version, GPU offload, compiled features.

The doorway (:mod:`homelab.llamacpp.backend`) loads llama-cpp-python only inside
:func:`read_build`: it is a large shared library, and a CUDA build fails to load on a machine
without the CUDA driver — which we must report, not crash on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from homelab.llamacpp.backend import (
    EXPECTED_VERSION,
    BuildRecord,
    LlamaCppUnavailable,
    build_facts,
)

LLAMA_CPP_PYTHON_VERSION = EXPECTED_VERSION
# rebuilds llama-cpp-python by the Makefile's build route (tools/build_route.py): with CUDA for
# every GPU present, by the system toolkit or NVIDIA's pip toolchain; run in the checkout
CUDA_REBUILD_COMMAND = "make rebuild-llama"

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
    cuda_version: str | None = None  # a CUDA build's runtime, e.g. "13.5"; None: not known
    record: BuildRecord | None = None  # how `make` built it; None: built some other way

    @property
    def cpu_only(self) -> bool:
        return self.gpu_offload is False

    @property
    def cuda(self) -> bool:
        return "CUDA" in self.backends

    @property
    def cuda_architectures(self) -> tuple[int, ...]:
        """The GPU architectures compiled in, from ggml's "CUDA : ARCHS = 860,890" -> (86, 89)."""
        found = re.search(r"ARCHS\s*=\s*([0-9,\s]+)", self.system_info or "")
        if found is None:
            return self.record.architectures if self.record else ()
        numbers = (int(part) for part in found[1].replace(" ", "").split(",") if part)
        return tuple(sorted({number // 10 for number in numbers}))

    @property
    def vmm(self) -> bool | None:
        """Whether a CUDA build has ggml's virtual-memory pool (not with GGML_CUDA_NO_VMM)."""
        if not self.cuda:
            return None
        return "NO_VMM" not in (self.system_info or "")


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
        cuda_version=facts.cuda_version,
        record=facts.record,
    )


def parse_backends(system_info: str) -> tuple[str, ...]:
    """Backend names in "CUDA : ARCHS = 890 | ... | CPU : SSE3 = 1 | ..." -> ("CUDA", "CPU")."""
    backends = []
    for piece in system_info.split("|"):
        name, separator, _ = piece.partition(" : ")
        if separator and name.strip():
            backends.append(name.strip())
    return tuple(backends)
