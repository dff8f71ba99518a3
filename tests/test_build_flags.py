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

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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


# The CUDA route (tools/build_route.py, which the Makefile asks). No GPU, NVIDIA driver or CUDA
# toolkit with cuBLAS can exist on the machines these tests run on: a fake `nvidia-smi` (and a
# fake `nvcc`, a fake driver library, a fake `pip`) stand in for them, as shell scripts on PATH.
# What runs is real: make, the Makefile and the route script, as `make install` runs them.

ROUTE_SCRIPT = ROOT / "tools" / "build_route.py"
RTX_4090 = "8.9, 580.65.06"


def load_route_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_route", ROUTE_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_route"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


route = load_route_module()


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def fake_nvidia_smi(bin_dir: Path, *gpus: str, fail: bool = False) -> None:
    """`nvidia-smi --query-gpu=compute_cap,driver_version` of the fake GPUs, one line each."""
    if fail:
        body = 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the driver."\n'
        script(bin_dir / "nvidia-smi", body + "exit 9\n")
        return
    lines = "".join(f'echo "{gpu}"\n' for gpu in gpus)
    script(bin_dir / "nvidia-smi", lines)


def fake_nvcc(bin_dir: Path, release: str, *, cublas: bool) -> Path:
    """An nvcc of ``release`` whose toolkit has cuBLAS (header and library) or not; its
    --dryrun names the include and library folders, on stderr as nvcc does."""
    toolkit = bin_dir.parent / f"cuda-{release}"
    (toolkit / "include").mkdir(parents=True, exist_ok=True)
    (toolkit / "lib").mkdir(parents=True, exist_ok=True)
    if cublas:
        (toolkit / "include" / "cublas_v2.h").write_text("")
        (toolkit / "lib" / "libcublas.so.12").write_text("")
    body = (
        'case "$1" in\n'
        f'  --version) echo "Cuda compilation tools, release {release}, V{release}.1";;\n'
        f"  --dryrun) echo '#$ INCLUDES=\"-I{toolkit}/include\"' >&2;"
        f" echo '#$ LIBRARIES=  \"-L{toolkit}/lib\"' >&2;;\n"
        "esac\n"
    )
    return script(bin_dir / "nvcc", body)


def make_route(
    tmp_path: Path, bin_dir: Path, *extra_args: str, **env: str
) -> tuple[list[str], str]:
    """`make -s cmake-args` on a machine whose PATH starts with ``bin_dir``: (args, reason)."""
    base = {k: v for k, v in os.environ.items() if k not in ("CMAKE_ARGS", "CUDACXX")}
    base.update({"PATH": f"{bin_dir}:/usr/bin:/bin", "HOMELAB_LIBCUDA": ""} | env)
    base.pop("CUDA_HOME", None)
    base.pop("CUDA_PATH", None)
    done = subprocess.run(
        [
            "make",
            "-s",
            "cmake-args",
            f"CPUINFO={cpuinfo(tmp_path, 'avx2')}",
            f"VENV={tmp_path / 'venv'}",
            *extra_args,
        ],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split(), done.stderr


def arg(args: list[str], name: str) -> str | None:
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"-D{name}=")]
    return values[0] if values else None


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@needs_make
def test_no_nvidia_smi_is_the_cpu_build_as_before(tmp_path: Path) -> None:
    args, reason = make_route(tmp_path, tmp_path / "bin")
    assert args == ["-DGGML_RPC=on"]
    assert "route: cpu — no nvidia-smi" in reason


@needs_make
def test_a_driver_without_a_toolkit_takes_nvidias_pip_toolchain(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, RTX_4090)
    args, reason = make_route(tmp_path, bin_dir, HOMELAB_NO_SYSTEM_CUDA="1")
    cuda_root = (tmp_path / "venv").resolve() / "cuda" / "nvidia" / "cu13"
    assert "-DGGML_RPC=on" in args and "-DGGML_CUDA=on" in args
    assert arg(args, "CMAKE_CUDA_ARCHITECTURES") == "89"
    assert arg(args, "CMAKE_CUDA_COMPILER") == str(cuda_root / "bin" / "nvcc")
    assert arg(args, "CUDAToolkit_ROOT") == str(cuda_root)
    # no driver library on this machine (HOMELAB_LIBCUDA empty, none installed): VMM off
    assert "-DGGML_CUDA_NO_VMM=ON" in args
    assert "route: pip — no system CUDA toolkit (nvcc)" in reason
    assert "CUDA architectures: 89" in reason


@needs_make
def test_the_pip_route_links_the_drivers_own_libcuda_where_there_is_one(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, RTX_4090)
    libcuda = tmp_path / "driver" / "libcuda.so.1"  # a fake: the driver's library
    libcuda.parent.mkdir()
    libcuda.write_text("")
    args, _ = make_route(
        tmp_path, bin_dir, HOMELAB_NO_SYSTEM_CUDA="1", HOMELAB_LIBCUDA=str(libcuda)
    )
    assert arg(args, "CUDA_cuda_driver_LIBRARY") == str(libcuda)
    assert "-DGGML_CUDA_NO_VMM=ON" not in args


@needs_make
def test_a_system_toolkit_the_driver_runs_is_used(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, "8.9, 550.54.14")
    nvcc = fake_nvcc(bin_dir, "12.4", cublas=True)
    args, reason = make_route(tmp_path, bin_dir)
    assert arg(args, "CMAKE_CUDA_COMPILER") == str(nvcc)
    assert arg(args, "CMAKE_CUDA_ARCHITECTURES") == "89"
    assert "-DGGML_CUDA_NO_VMM=ON" not in args  # a full toolkit links libcuda's stub
    assert "route: nvcc — the system CUDA 12.4 toolkit" in reason


@needs_make
def test_a_toolkit_without_cublas_falls_to_the_pip_toolchain(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, RTX_4090)
    fake_nvcc(bin_dir, "13.0", cublas=False)  # like this machine's /usr/local/cuda
    args, reason = make_route(tmp_path, bin_dir)
    assert "/cuda/nvidia/cu13/bin/nvcc" in (arg(args, "CMAKE_CUDA_COMPILER") or "")
    assert "toolkit" in reason and "has no cuBLAS" in reason and "route: pip" in reason


@needs_make
def test_a_driver_too_old_for_both_builds_for_the_cpu_and_names_both_fixes(
    tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, "8.9, 550.54.14")
    fake_nvcc(bin_dir, "13.0", cublas=True)  # CUDA 13 needs driver 580
    args, reason = make_route(tmp_path, bin_dir)
    assert args == ["-DGGML_RPC=on"]
    assert "route: cpu-fallback" in reason
    assert "CUDA 13.0, which needs driver >= 580" in reason
    assert "update the NVIDIA driver to 580 or newer" in reason
    assert "install a CUDA 12 toolkit" in reason and "make rebuild-llama" in reason


@needs_make
def test_every_gpu_of_the_box_gets_its_architecture(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, "8.6, 580.65.06", "8.9, 580.65.06", "8.6, 580.65.06")
    args, reason = make_route(tmp_path, bin_dir, HOMELAB_NO_SYSTEM_CUDA="1")
    assert arg(args, "CMAKE_CUDA_ARCHITECTURES") == "86;89"
    assert "CUDA architectures: 86;89" in reason


@needs_make
def test_cmake_args_set_by_the_user_win(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, RTX_4090)
    mine = "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=86;89"
    args, reason = make_route(tmp_path, bin_dir, CMAKE_ARGS=mine)
    assert args == mine.split()
    assert "route: user" in reason


@needs_make
def test_a_failing_nvidia_smi_builds_for_the_cpu_and_says_why(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, fail=True)
    args, reason = make_route(tmp_path, bin_dir)
    assert args == ["-DGGML_RPC=on"]
    assert "couldn't communicate with the driver" in reason and "route: cpu-fallback" in reason


def machine(**fields: Any) -> Any:
    defaults = {
        "gpus": [("8.9", "580.65.06")],
        "host_compiler": "g++",
        "host_compiler_major": 12,
        "free_bytes": 100 << 30,
    }
    return route.Machine(**(defaults | fields))


@pytest.mark.parametrize(
    ("fields", "reason", "fix"),
    [
        ({"host_compiler": None}, "no C++ compiler", "sudo apt install build-essential"),
        ({"host_compiler_major": 16}, "does not accept g++ 16", "CUDAHOSTCXX=g++-15"),
        ({"free_bytes": 2 << 30}, "only 2.0 GiB are free", "free some disk space"),
        ({"gpus": [("6.1", "580.65.06")]}, "cannot compile for compute 6.1", "CUDA 12"),
    ],
)
def test_no_route_is_one_message_with_the_fix_and_the_cpu_build(
    tmp_path: Path, fields: dict[str, Any], reason: str, fix: str
) -> None:
    chosen = route.choose(machine(**fields), tmp_path / "venv")
    assert chosen.name == "cpu-fallback"
    assert chosen.args == ["-DGGML_RPC=on"]
    assert reason in chosen.reason
    assert fix in (chosen.fix or "")


def fake_pip(bin_dir: Path, *, build_fails: bool = False) -> Path:
    """A pip that "installs" NVIDIA's wheels into --target (empty files where they put theirs)
    and, asked to build llama-cpp-python, prints a CMake error wall and fails, or succeeds."""
    wall = "".join(
        f'echo "CMake Error at ggml/src/ggml-cuda/CMakeLists.txt:{n} (x):"\n' for n in range(120)
    )
    body = (
        'target=""; prev=""\n'
        'for a in "$@"; do [ "$prev" = "--target" ] && target="$a"; prev="$a"; done\n'
        'if [ -n "$target" ]; then\n'
        '  root="$target/nvidia/cu13"; mkdir -p "$root/bin" "$root/lib"\n'
        '  touch "$root/bin/nvcc" "$root/lib/libcudart.so.13" "$root/lib/libcublas.so.13"'
        ' "$root/lib/libcublasLt.so.13"\n'
        '  echo "$@" > "$target/pip-args"; exit 0\n'
        "fi\n"
        + (
            wall + 'echo "ERROR: Failed building wheel for llama-cpp-python"\nexit 1\n'
            if build_fails
            else "exit 0\n"
        )
    )
    return script(bin_dir / "pip", body)


def test_prepare_installs_the_pip_toolchain_with_its_links_and_records_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "venv"
    pip = fake_pip(venv / "bin")
    monkeypatch.delenv("CUDAHOSTCXX", raising=False)
    chosen = route.choose(machine(), venv)
    assert route.prepare(chosen, venv, [str(pip)], None) == 0
    lib = venv.resolve() / "cuda" / "nvidia" / "cu13" / "lib"
    for name in ("libcudart.so", "libcublas.so", "libcublasLt.so"):
        assert (lib / name).is_symlink() and os.readlink(lib / name) == f"{name}.13"
    asked = (venv / "cuda" / "pip-args").read_text().split()
    assert "nvidia-cuda-nvcc==13.5.37" in asked and "nvidia-cublas==13.10.0.20" in asked
    record = json.loads((venv / "homelab-build.json").read_text())
    assert record["name"] == "pip" and record["architectures"] == [89]
    assert record["cuda_lib_dir"] == str(lib) and record["cuda_version"] == "13.5"
    assert record["vmm"] is False


@needs_make
def test_a_failed_build_is_a_short_message_with_the_cpu_fallback_not_a_cmake_wall(
    tmp_path: Path,
) -> None:
    venv = tmp_path / "venv"
    fake_pip(venv / "bin", build_fails=True)
    script(venv / "bin" / "python", "exit 0\n")  # the venv exists: make creates none
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, RTX_4090)
    env = {k: v for k, v in os.environ.items() if k not in ("CMAKE_ARGS", "CI")}  # CI: +60 lines
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", HOMELAB_NO_SYSTEM_CUDA="1", HOMELAB_LIBCUDA="")
    done = subprocess.run(
        ["make", "-s", "rebuild-llama", f"VENV={venv}", f"CPUINFO={cpuinfo(tmp_path, 'avx2')}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "homelab: building llama-cpp-python failed" in done.stderr
    assert 'CMAKE_ARGS="$(make -s cmake-args-cpu)" make install' in done.stderr
    assert len(done.stderr.splitlines()) < 20  # not the 120-line CMake wall
    assert (venv / "build.log").read_text().count("CMake Error") == 120
