"""CPU, RAM and the llama.cpp build, read for real (plus captured /proc/cpuinfo texts)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from homelab.hardware.build import parse_backends, read_build
from homelab.hardware.host import read_cpu, read_memory

# The first processor block of /proc/cpuinfo as Linux prints it on these CPUs.
ZEN4_CPUINFO = """\
processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD Ryzen 9 7950X 16-Core Processor
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl avx512_bf16

processor\t: 1
model name\t: something else entirely
"""
HASWELL_CPUINFO = """\
processor\t: 0
model name\t: Intel(R) Core(TM) i7-4770 CPU @ 3.40GHz
flags\t\t: fpu sse sse2 avx avx2 fma
"""
ARM_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32
CPU implementer\t: 0x41
"""


def test_cpu_on_this_machine() -> None:
    cpu = read_cpu()
    assert cpu.model and cpu.architecture
    assert cpu.logical_cores is not None and cpu.logical_cores >= 1
    assert cpu.usable_cores is not None and 1 <= cpu.usable_cores <= cpu.logical_cores
    if Path("/proc/cpuinfo").exists() and cpu.architecture in ("x86_64", "AMD64"):
        assert cpu.has_avx2 is not None


def test_cpu_flags_from_captured_cpuinfo() -> None:
    zen4 = read_cpu(ZEN4_CPUINFO)
    assert zen4.model == "AMD Ryzen 9 7950X 16-Core Processor"
    assert zen4.has_avx2 and zen4.has_avx512
    assert zen4.avx512_flags == ("avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_bf16")
    haswell = read_cpu(HASWELL_CPUINFO)
    assert haswell.has_avx2 and not haswell.has_avx512 and haswell.avx512_flags == ()


def test_cpu_without_x86_flags_says_unknown_rather_than_no() -> None:
    arm = read_cpu(ARM_CPUINFO)
    assert arm.has_avx2 is None and not arm.has_avx512
    assert arm.model  # falls back to the platform's name for the CPU


def test_memory_on_this_machine() -> None:
    memory = read_memory()
    assert 0 < memory.ram_available_bytes <= memory.ram_total_bytes
    assert 0 <= memory.swap_used_bytes <= max(memory.swap_total_bytes, memory.swap_used_bytes)
    if memory.cgroup_limit_bytes is not None:
        assert memory.cgroup_limit_bytes < memory.ram_total_bytes


def test_the_installed_llama_build() -> None:
    build = read_build()
    assert build.error is None
    assert build.version == "0.3.36"
    assert isinstance(build.gpu_offload, bool)
    assert build.system_info and "CPU" in build.backends
    assert ("CUDA" in build.backends) == build.gpu_offload


def test_backends_of_a_cuda_build() -> None:
    cuda_info = "CUDA : ARCHS = 890 | USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | CPU : AVX2 = 1 |"
    assert parse_backends(cuda_info) == ("CUDA", "CPU")
    assert parse_backends("") == ()


def test_an_unloadable_llama_cpp_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    build = read_build()
    assert build.version is None and build.gpu_offload is None
    assert build.error is not None and "pip install llama-cpp-python==0.3.36" in build.error
