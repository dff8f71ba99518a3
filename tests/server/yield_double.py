"""The NVML test double for yield/resume (there is no NVIDIA GPU or driver here).

One RTX 4090 as tests/hardware's FakeNvml describes it, on which this process holds what its
loaded models' plans hold (``ours()``, read at each query: loaded -> the plans' bytes,
unloaded -> 0) and other processes (a game, ComfyUI) take and release memory as the test
says. The watcher and the controller read it through the real NVML doorway
(``hardware.gpu.gpu_snapshot(fake)``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "hardware"))
from test_gpu_detection import (
    CUDA_BUILD,
    DRIVER_USED_BYTES,
    GIB,
    MIB,
    RTX_4090_NVML_TOTAL_BYTES,
    FakeNvml,
)

from homelab.hardware.gpu import GpuSnapshot, gpu_snapshot

__all__ = ["CUDA_BUILD", "DRIVER_USED_BYTES", "GIB", "MIB", "RTX_4090_NVML_TOTAL_BYTES"]


class SharedGpu:
    """A 4090 shared by this process (``ours()``) and others (``others``: pid -> bytes)."""

    def __init__(self, ours: Callable[[], int]) -> None:
        self.name = "NVIDIA GeForce RTX 4090"
        self.uuid = "GPU-4090-0000"
        self.total_bytes = RTX_4090_NVML_TOTAL_BYTES
        self.ours = ours
        self.others: dict[int, int] = {}
        self.graphics: list[tuple[int, int | None]] = []

    @property
    def compute(self) -> list[tuple[int, int | None]]:
        held = [(pid, n) for pid, n in self.others.items()]
        mine = self.ours()
        return [*held, (os.getpid(), mine)] if mine else held

    def used_bytes(self) -> int:
        return DRIVER_USED_BYTES + sum(n or 0 for _, n in self.compute)

    def take(self, pid: int, n_bytes: int) -> None:
        self.others[pid] = n_bytes

    def leave(self, pid: int) -> None:
        self.others.pop(pid, None)


def shared_double(
    ours: Callable[[], int], process_names: dict[int, str] | None = None
) -> tuple[SharedGpu, FakeNvml, Callable[[], Sequence[GpuSnapshot]]]:
    """The GPU, the fake pynvml and the snapshot reader the controller polls."""
    gpu = SharedGpu(ours)
    fake = FakeNvml([gpu], process_names=process_names or {})  # type: ignore[list-item]

    def read() -> Sequence[GpuSnapshot]:
        return gpu_snapshot(fake)

    return gpu, fake, read


def start_named_process(folder: Path, name: str) -> subprocess.Popen[bytes]:
    """A real process called ``name`` (a copy of ``sleep``): what psutil lists as a game."""
    sleep = shutil.which("sleep")
    assert sleep is not None
    binary = folder / name
    shutil.copy(sleep, binary)
    return subprocess.Popen([str(binary), "60"])
