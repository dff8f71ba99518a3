"""How llama.cpp is compiled on an AMX CPU: the Makefile (llama-cpp-python, which homelab
loads) and benchmarks/llama_tools.py (llama.cpp's own tools, compared with it; it reads the
Makefile's flags) agree.

On a CPU with AMX, ``-march=native`` compiles ggml's AMX matmul, and this llama.cpp cannot
run it: GCC 12 (Debian 12's) drops the stores that fill its tile configuration, so
``ldtilecfg`` loads garbage and every quantized model dies of a general protection fault at its
first prompt; with the stores kept (``-fno-dse``) the demo DeepSeek (MLA) model fails
``GGML_ASSERT(*cur_backend_id != -1)`` while its context is made. ``-mno-amx-int8`` leaves
the AMX matmul out (explicit ``-mno-`` flags win over ``-march=native`` whatever their order).
The CPU's flags are read from a cpuinfo file, given here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks.llama_tools import amx_workaround_flags

ROOT = Path(__file__).resolve().parent.parent
KEEP_STORES = ("-DCMAKE_C_FLAGS=-mno-amx-int8", "-DCMAKE_CXX_FLAGS=-mno-amx-int8")


def cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / f"cpuinfo-{len(flags)}"
    path.write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: {flags}\n\n")
    return path


def make_cmake_args(info: Path) -> list[str]:
    """The CMAKE_ARGS ``make`` hands pip, for a machine whose cpuinfo is ``info``."""
    env = {k: v for k, v in os.environ.items() if k != "CMAKE_ARGS"}
    env["PATH"] = "/usr/bin:/bin"  # no nvidia-smi: a CPU build
    result = subprocess.run(
        ["make", "-s", "cmake-args", f"CPUINFO={info}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.split()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("fpu sse2 avx2 avx512f avx512_vnni amx_bf16 amx_tile amx_int8", KEEP_STORES),
        ("fpu sse2 avx2 avx512f avx512_vnni", ()),
    ],
)
def test_the_library_and_the_tools_are_built_alike(
    tmp_path: Path, flags: str, expected: tuple[str, ...]
) -> None:
    info = cpuinfo(tmp_path, flags)
    library = make_cmake_args(info)
    assert "-DGGML_RPC=on" in library  # the RPC backend is always built
    assert tuple(arg for arg in library if "amx" in arg) == expected
    assert amx_workaround_flags(info) == expected


def test_an_unreadable_cpuinfo_adds_nothing(tmp_path: Path) -> None:
    assert amx_workaround_flags(tmp_path / "missing") == ()
    assert amx_workaround_flags(cpuinfo(tmp_path, "")) == ()
