"""Planner test helpers: hardware descriptions built from the GPU profiles (no GPU needed)."""

from __future__ import annotations

from homelab.hardware.profiles import find_gpu_profile
from homelab.planner.budget import Hardware, host_device, profile_gpu, vram_gpu

GIB = 1 << 30


def profile_hardware(gpu: str = "rtx-4090", ram_gib: int = 64) -> Hardware:
    """A machine with one profiled GPU and ``ram_gib`` of RAM (what ``--gpu`` plans for)."""
    host = host_device(ram_gib * GIB, f"{ram_gib} GiB (test)")
    return Hardware((host, profile_gpu(find_gpu_profile(gpu))), "profile")


def vram_hardware(vram_gib: float, ram_gib: int = 64) -> Hardware:
    host = host_device(ram_gib * GIB, f"{ram_gib} GiB (test)")
    return Hardware((host, vram_gpu(int(vram_gib * GIB))), "vram")


def cpu_hardware(ram_gib: int = 16) -> Hardware:
    return Hardware((host_device(ram_gib * GIB, f"{ram_gib} GiB (test)"),), "cpu")
